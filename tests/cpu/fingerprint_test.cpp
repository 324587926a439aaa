// SPDX-License-Identifier: Apache-2.0
// Call fingerprints (backends/fingerprint.hpp): every field of a call changes them, and messages
// name the call they stand for.
#include "backends/fingerprint.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "kernels/common/fingerprint_hash.hpp"

namespace tpcomm {
namespace {

TEST(Fingerprint, EveryPartOfACallChangesIt) {
  const std::uint64_t base = fingerprint(Op::kAllReduce, DType::kBF16, 4096);
  std::set<std::uint64_t> seen{base};
  for (std::uint64_t other : {
           fingerprint(Op::kAllReduce, DType::kBF16, 8192),
           fingerprint(Op::kAllReduce, DType::kBF16, 4095),
           fingerprint(Op::kAllReduce, DType::kF32, 4096),
           fingerprint(Op::kAllReduce, DType::kF16, 4096),
           fingerprint(Op::kAllGather, DType::kBF16, 4096),
           fingerprint(Op::kAllToAll, DType::kBF16, 4096),
           fingerprint(Op::kGather, DType::kBF16, 4096),
           fingerprint(Op::kGather, DType::kBF16, 4096, 1),
           fingerprint(Op::kAllReduce, DType::kBF16, 4096, 1),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(1, 0, 4096)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(1, 0, 1024)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(2, 0, 4096)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(4, 0, 4096)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(1, 1, 4096)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(1, 2, 4096)),
           fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 4096, fused_shape(1, 4, 4096)),
           fingerprint(Op::kMoeFinalize, DType::kBF16, 4096, fused_shape(1, 0, 4096)),
       }) {
    EXPECT_TRUE(seen.insert(other).second) << describe_fingerprint(other);
  }
  for (std::uint64_t fp : seen) EXPECT_NE(fp, 0u);
  EXPECT_EQ(base, fingerprint(Op::kAllReduce, DType::kBF16, 4096));
}

TEST(Fingerprint, ShapeHashesDifferForDifferentShapes) {
  const std::vector<std::int64_t> a{1, 2, 3, 4}, b{1, 2, 4, 3}, c{1, 2, 3};
  EXPECT_NE(shape_hash(a), shape_hash(b));
  EXPECT_NE(shape_hash(a), shape_hash(c));
  EXPECT_EQ(shape_hash(a), shape_hash(std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_LT(shape_hash(a), 1u << 23);
}

TEST(Fingerprint, DescribesTheCall) {
  EXPECT_EQ(describe_fingerprint(fingerprint(Op::kAllReduce, DType::kBF16, 4096)),
            "all_reduce 4096 bfloat16");
  EXPECT_EQ(describe_fingerprint(fingerprint(Op::kAllGather, DType::kU8, 8192)),
            "all_gather 8192 uint8");
  EXPECT_EQ(describe_fingerprint(fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 57344,
                                             fused_shape(1, 0, 7168))),
            "all_reduce_add_rmsnorm 57344 bfloat16 (hidden 7168)");
  EXPECT_EQ(describe_fingerprint(
                fingerprint(Op::kAllReduceAddRmsNorm, DType::kF16, 1024, fused_shape(2, 0, 512))),
            "all_reduce_add_rmsnorm 1024 half (hidden 512, f8e4m3 out)");
  EXPECT_EQ(describe_fingerprint(
                fingerprint(Op::kAllReduceAddRmsNorm, DType::kF16, 1024, fused_shape(4, 7, 512))),
            "all_reduce_add_rmsnorm 1024 half (hidden 512, f8e4m3 out per group, no residual, "
            "f32 gamma, 1 + gamma)");
  EXPECT_EQ(describe_fingerprint(fingerprint(Op::kAllToAll, DType::kBF16, 64, 0x3fa21)),
            "all_to_all 64 bfloat16 (shape 0x03fa21)");
  EXPECT_EQ(describe_fingerprint(fingerprint(Op::kGather, DType::kBF16, 4096, 2)),
            "gather 4096 bfloat16 (to rank 2)");
  EXPECT_EQ(describe_fingerprint(
                fingerprint(Op::kMoeFinalize, DType::kBF16, 7168, fused_shape(1, 0, 7168))),
            "moe_finalize_all_reduce_add_rmsnorm 7168 bfloat16 (hidden 7168)");
  EXPECT_EQ(describe_fingerprint(0), "an operation of unknown fingerprint 0x0000000000000000");
}

// Calls out of step (NOTE [fingerprints]): the same call made as different call numbers differs in
// both hashes the kernels compare (the barrier flag's 32 bits, the Lamport header's 30) for every
// pair of numbers less than 2^30 apart, here every pair among 8192 consecutive numbers, at the
// start and across the 32-bit wrap; the host gets the fingerprint back from the posted number.
TEST(Fingerprint, CallNumbersKeyEveryHashTheKernelsCompare) {
  for (const std::uint64_t fp :
       {fingerprint(Op::kAllReduce, DType::kBF16, 4096),
        fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, 57344, fused_shape(1, 0, 7168)),
        fingerprint(Op::kAllToAll, DType::kI32, 1 << 20, 0x3fa21)}) {
    for (const std::uint32_t first : {0u, 0xFFFFF000u}) {
      std::set<std::uint32_t> flags, headers;
      for (std::uint32_t i = 0; i < 8192; ++i) {
        const std::uint32_t call = first + i;
        const std::uint64_t keyed = keyed_fingerprint(CallTag{fp, call});
        EXPECT_EQ(unkeyed_fingerprint(keyed, call), fp);
        flags.insert(kernels::flag_hash(keyed));
        headers.insert(kernels::lamport_header(keyed));
      }
      EXPECT_EQ(flags.size(), 8192u) << describe_fingerprint(fp);
      EXPECT_EQ(headers.size(), 8192u) << describe_fingerprint(fp);
    }
  }
  // A pad no kernel posted to (fingerprint and call 0) still reads as no call.
  EXPECT_EQ(unkeyed_fingerprint(0, 0), 0u);
  EXPECT_EQ(keyed_fingerprint(CallTag{0x1234, 0}), 0x1234u);
}

// Poison (NOTE [poisoned outputs]): NaN in every floating type, the largest value in unsigned
// integers, the most negative in signed ones, never -1, element by element in the pattern's 8
// bytes.
TEST(Poison, EveryTypeGetsAValueNoResultMeans) {
  for (DType t :
       {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI8, DType::kU8, DType::kI32,
        DType::kU32, DType::kI64, DType::kU64, DType::kF8E4M3, DType::kF8E5M2}) {
    const std::uint64_t pattern = kernels::poison_pattern(t);
    const std::size_t size = dtype_size(t);
    for (std::size_t at = 0; at < 8; at += size) {
      unsigned char bytes[8];
      std::memcpy(bytes, &pattern, 8);
      std::uint64_t element = 0;
      std::memcpy(&element, bytes + at, size);
      const std::uint64_t top = std::uint64_t{1} << (8 * size - 1);
      const std::uint64_t ones = size == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << 8 * size) - 1;
      const bool is_signed = t == DType::kI8 || t == DType::kI32 || t == DType::kI64;
      EXPECT_EQ(element, is_signed ? top : ones) << to_string(t) << " element at byte " << at;
    }
  }
}

}  // namespace
}  // namespace tpcomm
