// SPDX-License-Identifier: Apache-2.0
// The Lamport kernels' empty-mark tests of a 32-bit word (kernels/common/lamport_mark.hpp), run
// on the host against the element-wise definition: a 16-bit half is empty where it is 0x8000.
// Every low half against a set of high halves and the reverse, and a stride through all words.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/common/lamport_mark.hpp"

namespace tpcomm {
namespace {

using kernels::lamport_empty_halves;
using kernels::lamport_outgoing_word;
using kernels::lamport_word_has_empty;

bool empty(std::uint32_t half) { return half == kLamportEmpty; }

/// Checks the three tests on word `w`; false (with a failure) where one differs.
bool check(std::uint32_t w) {
  const std::uint32_t lo = w & 0xFFFFu, hi = w >> 16;
  const std::uint32_t halves = (empty(lo) ? 0x8000u : 0u) | (empty(hi) ? 0x80000000u : 0u);
  std::uint32_t sent = w;
  if (empty(lo)) sent &= 0xFFFF0000u;
  if (empty(hi)) sent &= 0x0000FFFFu;
  const bool has = (lamport_word_has_empty(w) != 0) == (empty(lo) || empty(hi));
  const bool exact = lamport_empty_halves(w) == halves;
  const bool outgoing = lamport_outgoing_word(w) == sent;
  EXPECT_TRUE(has && exact && outgoing) << std::hex << "word 0x" << w;
  return has && exact && outgoing;
}

TEST(LamportMark, WordTestsMatchTheElementWiseDefinition) {
  // Halves next to the mark, zeros of both signs, the extremes, and the borrow's neighbours.
  const std::vector<std::uint32_t> special = {0x0000, 0x0001, 0x7FFE, 0x7FFF, 0x8000, 0x8001,
                                              0xFFFE, 0xFFFF, 0x0080, 0x4000, 0xC000, 0x3F80};
  for (std::uint32_t a = 0; a <= 0xFFFFu; ++a)
    for (std::uint32_t b : special) {
      if (!check(b << 16 | a) || !check(a << 16 | b)) return;
    }
  for (std::uint64_t w = 0; w <= 0xFFFFFFFFull; w += 65521)
    if (!check(static_cast<std::uint32_t>(w))) return;
}

TEST(LamportMark, SendsNoEmptyMark) {
  EXPECT_EQ(lamport_outgoing_word(kernels::kEmpty2), 0u);
  EXPECT_EQ(lamport_outgoing_word(0x80001234u), 0x00001234u);
  EXPECT_EQ(lamport_outgoing_word(0x12348000u), 0x12340000u);
  EXPECT_EQ(lamport_outgoing_word(0x80018001u), 0x80018001u);
  EXPECT_NE(lamport_word_has_empty(0x00008000u), 0u);
  EXPECT_NE(lamport_word_has_empty(0x80000000u), 0u);
  EXPECT_EQ(lamport_word_has_empty(0x00000000u), 0u);
}

}  // namespace
}  // namespace tpcomm
