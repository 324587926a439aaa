// SPDX-License-Identifier: Apache-2.0
// The Lamport empty mark (NOTE [lamport] in ipc/layout.hpp) tested in 32-bit words, both 16-bit
// halves at once: the Lamport kernels test every pack they poll this way, and the cpu tier checks
// the tests against the element-wise definition on the host.
#pragma once

#include <cstdint>

#include "ipc/layout.hpp"
#include "kernels/common/host_device.hpp"

namespace tpcomm::kernels {

/// Two empty marks: a word whose halves are both empty.
inline constexpr std::uint32_t kEmpty2 = kLamportEmpty * 0x10001u;

/// Non-zero when either half of `w` holds the empty mark, that is, where `w ^ kEmpty2` has a zero
/// half. The borrow out of a zero low half can mark the high half too, which is only ever seen
/// with a zero half below it: whether the word holds a mark is exact, which half not.
TPCOMM_HOST_DEVICE std::uint32_t lamport_word_has_empty(std::uint32_t w) {
  const std::uint32_t d = w ^ kEmpty2;
  return (d - 0x00010001u) & ~d & 0x80008000u;
}

/// The top bit of each half of `w` that holds the empty mark, exactly: the low 15 bits of each
/// half are added apart from its top bit, so no carry crosses into the other half.
TPCOMM_HOST_DEVICE std::uint32_t lamport_empty_halves(std::uint32_t w) {
  const std::uint32_t d = w ^ kEmpty2;
  return ~(((d & 0x7FFF7FFFu) + 0x7FFF7FFFu) | d) & 0x80008000u;
}

/// `w` as sent: each half that holds the empty mark (-0.0) becomes +0.0, which adds the same.
TPCOMM_HOST_DEVICE std::uint32_t lamport_outgoing_word(std::uint32_t w) {
  return w & ~lamport_empty_halves(w);
}

}  // namespace tpcomm::kernels
