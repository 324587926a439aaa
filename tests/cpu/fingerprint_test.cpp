// SPDX-License-Identifier: Apache-2.0
// Call fingerprints (backends/fingerprint.hpp): every field of a call changes them, and messages
// name the call they stand for.
#include "backends/fingerprint.hpp"

#include <gtest/gtest.h>

#include <set>
#include <vector>

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

}  // namespace
}  // namespace tpcomm
