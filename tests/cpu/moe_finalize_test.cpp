// SPDX-License-Identifier: Apache-2.0
// The MoE finalize's request (ops/moe.hpp): where the combine writes x, the combine's arguments,
// the fingerprint, and what is refused before anything runs. Pure host code: the views point at
// host memory that no kernel touches.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "backends/fingerprint.hpp"
#include "ops/call.hpp"
#include "ops/moe.hpp"

namespace tpcomm {
namespace {

constexpr std::int64_t kTokens = 4, kTopK = 8, kRows = 40, kHidden = 256;

struct Tensors {
  std::vector<char> experts = std::vector<char>(kRows * kHidden * 2);
  std::vector<char> map = std::vector<char>(kTokens * kTopK * 4);
  std::vector<char> weights = std::vector<char>(kTokens * kTopK * 4);
  std::vector<char> residual = std::vector<char>(kTokens * kHidden * 2);
  std::vector<char> gamma = std::vector<char>(kHidden * 2);
  std::vector<char> norm_out = std::vector<char>(kTokens * kHidden * 2);
  std::vector<char> residual_out = std::vector<char>(kTokens * kHidden * 2);
  std::vector<char> row_scales = std::vector<char>(kTokens * 4);

  static TensorView view(std::vector<char>& b, DType t, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(b.data(), t, shape, 0);
  }
  MoeCombine moe(DType weights_dtype = DType::kBF16, DType map_dtype = DType::kI32,
                 std::int64_t top_k = kTopK) {
    return {view(experts, DType::kBF16, {kRows, kHidden}), view(map, map_dtype, {kTokens, top_k}),
            view(weights, weights_dtype, {kTokens, top_k}), TensorView{}};
  }
};

Status make(Tensors& t, const MoeCombine& moe, const TensorView& norm_out, Call* call,
            const Fp8Scales& fp8 = {}) {
  const GroupShape g{2, 0, 0};
  return make_moe_finalize(g, moe, Tensors::view(t.residual, DType::kBF16, {kTokens, kHidden}),
                           Tensors::view(t.gamma, DType::kBF16, {kHidden}), 1e-6f, norm_out,
                           Tensors::view(t.residual_out, DType::kBF16, {kTokens, kHidden}), fp8,
                           NormWeight::kGamma, call);
}

TEST(MoeFinalize, TheCombineWritesIntoNormOutWhereItCan) {
  Tensors t;
  Call c;
  const TensorView norm_out = Tensors::view(t.norm_out, DType::kBF16, {kTokens, kHidden});
  ASSERT_EQ(make(t, t.moe(), norm_out, &c), Status::kOk) << c.message;
  const Request& r = c.request;
  EXPECT_EQ(r.op, Op::kMoeFinalize);
  EXPECT_EQ(r.in.data, norm_out.data);  // x is norm_out: the fused call then runs in place
  ASSERT_NE(r.reduce()->moe, nullptr);
  EXPECT_EQ(r.reduce()->moe->tokens, kTokens);
  EXPECT_EQ(r.reduce()->moe->rows, kRows);
  EXPECT_EQ(r.reduce()->moe->hidden, kHidden);
  EXPECT_EQ(r.reduce()->moe->top_k, kTopK);
  EXPECT_FALSE(r.reduce()->moe->weights_f32);
  EXPECT_EQ(r.reduce()->moe->shared, nullptr);
  ASSERT_NE(r.reduce()->fusion, nullptr);
  EXPECT_EQ(r.reduce()->fusion->norm_out, norm_out.data);
  EXPECT_EQ(describe_fingerprint(r.tag.fingerprint),
            "moe_finalize_all_reduce_add_rmsnorm 1024 bfloat16 (hidden 256)");
  // f32 weights with bf16 experts.
  Call f;
  ASSERT_EQ(make(t, t.moe(DType::kF32), norm_out, &f), Status::kOk) << f.message;
  EXPECT_TRUE(f.request.reduce()->moe->weights_f32);
}

TEST(MoeFinalize, ATemporaryWhereNormOutCannotHoldX) {
  Tensors t;
  // An f8e4m3 norm_out (x is bf16).
  Call fp8;
  const Fp8Scales rows{{}, Tensors::view(t.row_scales, DType::kF32, {kTokens}), {}};
  ASSERT_EQ(
      make(t, t.moe(), Tensors::view(t.norm_out, DType::kF8E4M3, {kTokens, kHidden}), &fp8, rows),
      Status::kOk)
      << fp8.message;
  EXPECT_EQ(fp8.request.in.data, nullptr);
  EXPECT_EQ(fp8.request.in.dtype, DType::kBF16);
  EXPECT_EQ(fp8.request.in.numel(), kTokens * kHidden);
  // A norm_out that overlaps an input of the combine.
  Call overlap;
  ASSERT_EQ(make(t, t.moe(), Tensors::view(t.experts, DType::kBF16, {kTokens, kHidden}), &overlap),
            Status::kOk)
      << overlap.message;
  EXPECT_EQ(overlap.request.in.data, nullptr);
}

TEST(MoeFinalize, BadArgumentsAreRefusedNamingThem) {
  Tensors t;
  const TensorView norm_out = Tensors::view(t.norm_out, DType::kBF16, {kTokens, kHidden});
  auto refused = [&](const MoeCombine& moe, const TensorView& out, const std::string& needle) {
    Call c;
    EXPECT_EQ(make(t, moe, out, &c), Status::kInvalidArgument) << needle;
    EXPECT_NE(c.message.find(needle), std::string::npos) << c.message;
  };
  refused(t.moe(DType::kBF16, DType::kI64), norm_out, "map must be int32 [tokens, top_k]");
  refused(t.moe(DType::kF16), norm_out, "weights must be [4, 8] of f32 or bfloat16");
  MoeCombine shared = t.moe();
  shared.shared = Tensors::view(t.residual, DType::kBF16, {kTokens, kHidden - 1});
  refused(shared, norm_out, "shared must be [4, 256] of bfloat16");
  refused(t.moe(), Tensors::view(t.norm_out, DType::kBF16, {kTokens, kHidden / 2}),
          "the combined output must be [4, 256] of bfloat16");
  // The fused call's own rules apply too.
  refused(t.moe(), Tensors::view(t.residual_out, DType::kBF16, {kTokens, kHidden}),
          "norm_out overlaps residual_out");
  // A top-k past the combine's shared-memory table.
  std::vector<char> wide(kTokens * 33 * 4);
  MoeCombine many = t.moe();
  many.map = Tensors::view(wide, DType::kI32, {kTokens, 33});
  many.weights = Tensors::view(wide, DType::kF32, {kTokens, 33});
  refused(many, norm_out, "top_k is 33; 1 to 32 expected");
  // A row wider than the combine kernel's grid takes (a view only: nothing is read).
  MoeCombine wide_rows = t.moe();
  wide_rows.experts = Tensors::view(t.experts, DType::kBF16, {1, 8388481});
  refused(wide_rows, norm_out, "hidden is 8388481; at most 8388480 supported");
}

}  // namespace
}  // namespace tpcomm
