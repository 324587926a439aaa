// SPDX-License-Identifier: Apache-2.0
// The hashes of a fingerprint that the kernels compare (NOTE [fingerprints] in
// kernels/common/sync.cuh): written once for the kernels and the host, which checks on the cpu
// tier that call numbers change them.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace tpcomm::kernels {

/// The 32 bits of a fingerprint that travel in a barrier flag (NOTE [fingerprints]).
TPCOMM_HOST_DEVICE std::uint32_t flag_hash(std::uint64_t fingerprint) {
  return static_cast<std::uint32_t>(fingerprint ^ (fingerprint >> 32));
}

/// The header that carries fingerprint `fp` in a Lamport buffer (NOTE [fingerprints]): 30 bits
/// of its `flag_hash`, 15 in each 16-bit half below a clear top bit, so that neither half is the
/// empty mark. One 32-bit word: a thread polls it beside its packs in one register.
TPCOMM_HOST_DEVICE std::uint32_t lamport_header(std::uint64_t fp) {
  const std::uint32_t h = flag_hash(fp);
  return (h & 0x7FFFu) | ((h >> 15) & 0x7FFFu) << 16;
}

}  // namespace tpcomm::kernels
