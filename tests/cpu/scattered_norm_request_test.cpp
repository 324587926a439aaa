// SPDX-License-Identifier: Apache-2.0
// The sequence-parallel fused norm's request (ops/fused_norm.hpp): a scattered `Reduce` with the
// norm's epilogue over this rank's rows, its fingerprint, and what is refused before anything
// runs. Pure host code: the views point at host memory that no kernel touches.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/fingerprint.hpp"
#include "ops/call.hpp"
#include "ops/fused_norm.hpp"

namespace tpcomm {
namespace {

constexpr std::int64_t kTokens = 8, kHidden = 256, kWorld = 4, kRows = kTokens / kWorld;

struct Tensors {
  std::vector<char> x = std::vector<char>(kTokens * kHidden * 2);
  std::vector<char> residual = std::vector<char>(kRows * kHidden * 2);
  std::vector<char> gamma = std::vector<char>(kHidden * 2);
  std::vector<char> norm_out = std::vector<char>(kTokens * kHidden * 2);
  std::vector<char> residual_out = std::vector<char>(kTokens * kHidden * 2);

  static TensorView view(std::vector<char>& b, std::int64_t rows, std::int64_t offset = 0) {
    return TensorView::contiguous(b.data() + offset, DType::kBF16, {rows, kHidden}, 0);
  }
};

Status make(Tensors& t, const TensorView& x, const TensorView& norm_out,
            const TensorView& residual_out, Call* call, int rank = 1) {
  return make_reduce_scatter_add_rmsnorm(
      GroupShape{kWorld, rank, 0}, x, Tensors::view(t.residual, kRows),
      TensorView::contiguous(t.gamma.data(), DType::kBF16, {kHidden}, 0), 1e-6f, norm_out,
      residual_out, Fp8Scales{}, NormWeight::kGamma, call);
}

TEST(ReduceScatterAddRmsNormRequest, AScatteredSumWithTheNormOfThisRanksRows) {
  Tensors t;
  Call c;
  const TensorView x = Tensors::view(t.x, kTokens);
  const TensorView norm_out = Tensors::view(t.norm_out, kRows);
  const TensorView residual_out = Tensors::view(t.residual_out, kRows);
  ASSERT_EQ(make(t, x, norm_out, residual_out, &c), Status::kOk) << c.message;
  const Request& r = c.request;
  EXPECT_EQ(r.op, Op::kReduceScatterAddRmsNorm);
  EXPECT_EQ(r.in.data, x.data);
  EXPECT_EQ(r.in.numel(), kTokens * kHidden);
  EXPECT_EQ(r.out.data, residual_out.data);
  ASSERT_NE(r.reduce(), nullptr);
  EXPECT_TRUE(r.reduce()->scattered);
  EXPECT_EQ(r.reduce()->moe, nullptr);
  ASSERT_NE(r.reduce()->fusion, nullptr);
  EXPECT_EQ(r.reduce()->fusion->hidden, kHidden);
  EXPECT_EQ(r.reduce()->fusion->norm_out, norm_out.data);
  EXPECT_EQ(r.reduce()->norm_out->data, norm_out.data);
  EXPECT_FALSE(c.empty);
  EXPECT_EQ(describe_fingerprint(r.tag.fingerprint),
            "reduce_scatter_add_rmsnorm 2048 bfloat16 (hidden 256)");
  // The same call on another rank: the same fingerprint.
  Call other;
  ASSERT_EQ(make(t, x, norm_out, residual_out, &other, 3), Status::kOk) << other.message;
  EXPECT_EQ(other.request.tag.fingerprint, r.tag.fingerprint);
}

TEST(ReduceScatterAddRmsNormRequest, WhatIsRefused) {
  Tensors t;
  const TensorView norm_out = Tensors::view(t.norm_out, kRows);
  const TensorView residual_out = Tensors::view(t.residual_out, kRows);
  auto refused = [&](const TensorView& x, const TensorView& n, const TensorView& o,
                     const char* why) {
    Call c;
    EXPECT_EQ(make(t, x, n, o, &c), Status::kInvalidArgument) << why;
    EXPECT_NE(c.message.find(why), std::string::npos) << c.message;
  };
  refused(Tensors::view(t.x, kTokens - 1), norm_out, residual_out, "do not split evenly");
  refused(TensorView::contiguous(t.x.data(), DType::kBF16, {kTokens * kHidden}, 0), norm_out,
          residual_out, "must be [tokens, hidden]");
  // Outputs of every token, not this rank's.
  refused(Tensors::view(t.x, kTokens), Tensors::view(t.norm_out, kTokens),
          Tensors::view(t.residual_out, kTokens), "reduce_scatter_add_rmsnorm");
  refused(Tensors::view(t.x, kTokens), Tensors::view(t.x, kRows, kRows * kHidden * 2), residual_out,
          "overlaps x");
}

}  // namespace
}  // namespace tpcomm
