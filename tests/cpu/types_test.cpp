// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kU64), 8u);
  EXPECT_EQ(dtype_size(DType::kF8E4M3), 1u);
  EXPECT_EQ(to_string(DType::kBF16), "bfloat16");
  EXPECT_EQ(to_string(DType::kF16), "half");
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float"), DType::kF32);
  EXPECT_EQ(parse_dtype("int32"), DType::kI32);
  EXPECT_EQ(parse_dtype("f8e5m2"), DType::kF8E5M2);
  EXPECT_FALSE(parse_dtype("bfloat17").has_value());
  for (int t = 0; t <= static_cast<int>(DType::kF8E5M2); ++t) {
    auto d = static_cast<DType>(t);
    EXPECT_EQ(parse_dtype(to_string(d)), d) << to_string(d);
  }
}

TEST(ReduceOp, RoundTrip) {
  for (auto op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg})
    EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  EXPECT_FALSE(parse_reduce_op("mulsum").has_value());
}

TEST(TensorView, ContiguousArithmetic) {
  alignas(16) static char buf[1];
  auto v = TensorView::contiguous(buf, DType::kBF16, {4, 3, 5});
  EXPECT_EQ(v.ndim, 3);
  EXPECT_EQ(v.numel(), 60);
  EXPECT_EQ(v.nbytes(), 120);
  EXPECT_EQ(v.strides[0], 15);
  EXPECT_EQ(v.strides[1], 5);
  EXPECT_EQ(v.strides[2], 1);
  EXPECT_TRUE(v.is_contiguous());
  auto f = v.flattened();
  EXPECT_EQ(f.ndim, 1);
  EXPECT_EQ(f.numel(), 60);
  EXPECT_TRUE(f.same_layout(TensorView::flat(buf, DType::kBF16, 60)));
  EXPECT_FALSE(f.same_layout(TensorView::flat(buf, DType::kF16, 60)));
}

TEST(TensorView, NonContiguousAndEdgeCases) {
  auto v = TensorView::contiguous(nullptr, DType::kF32, {4, 6});
  // A transpose: shape (6, 4) with strides (1, 6).
  TensorView t = v;
  t.shape[0] = 6;
  t.shape[1] = 4;
  t.strides[0] = 1;
  t.strides[1] = 6;
  EXPECT_FALSE(t.is_contiguous());
  // Extent-1 dimensions do not break contiguity whatever their stride.
  auto u = TensorView::contiguous(nullptr, DType::kF32, {1, 8});
  u.strides[0] = 12345;
  EXPECT_TRUE(u.is_contiguous());
  // Empty tensors are contiguous and have no bytes.
  auto e = TensorView::contiguous(nullptr, DType::kF32, {0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.nbytes(), 0);
  EXPECT_TRUE(e.is_contiguous());
  // A scalar has one element.
  TensorView s;
  s.dtype = DType::kF64;
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.nbytes(), 8);
}

TEST(TensorView, Alignment) {
  alignas(64) static char buf[64];
  auto v = TensorView::flat(buf, DType::kBF16, 8);
  EXPECT_TRUE(v.is_aligned(16));
  v.data = buf + 2;
  EXPECT_FALSE(v.is_aligned(16));
  EXPECT_TRUE(v.is_aligned(2));
}

TEST(TensorView, RejectsBadShapes) {
  EXPECT_THROW(TensorView::contiguous(nullptr, DType::kF32, {1, 2, 3, 4, 5, 6, 7}), Error);
  try {
    TensorView::contiguous(nullptr, DType::kF32, {2, -1});
    FAIL() << "negative extent accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("negative extent"), std::string::npos);
  }
}

}  // namespace
}  // namespace tpcomm
