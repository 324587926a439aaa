// SPDX-License-Identifier: Apache-2.0
#include "ops/fused_norm.hpp"

#include <cmath>

#include "backends/fingerprint.hpp"
#include "core/check.hpp"
#include "core/overlap.hpp"
#include "ops/call.hpp"

namespace tpcomm {

int norm_form(const kernels::FusionParams& f) noexcept {
  return (f.residual == nullptr ? 1 : 0) | (f.gamma_f32 ? 2 : 0) | (f.gamma_plus_one ? 4 : 0);
}

Status check_add_rmsnorm(const TensorView& x, const TensorView& residual, const TensorView& gamma,
                         float eps, const TensorView& norm_out, const TensorView& residual_out,
                         const Fp8Scales& fp8, NormWeight weight, const char* op,
                         AddRmsNormCall* call, std::string* message, bool x_made_later) noexcept {
  auto bad = [&](auto&&... what) {
    *message = detail::concat(op, ": ", what...);
    return Status::kInvalidArgument;
  };
  if (x.dtype != DType::kF16 && x.dtype != DType::kBF16 && x.dtype != DType::kF32)
    return bad("x is ", to_string(x.dtype), "; f16, bf16 or f32 expected");
  if (x.ndim < 1 || x.shape[x.ndim - 1] < 1)
    return bad("x must have a last dimension (hidden) of at least 1 element");
  const std::int64_t hidden = x.shape[x.ndim - 1];
  const struct {
    const TensorView* view;
    const char* name;
  } views[] = {{&x, "x"},
               {&residual, "residual"},
               {&gamma, "gamma"},
               {&norm_out, "norm_out"},
               {&residual_out, "residual_out"}};
  const bool has_residual = residual.data != nullptr;  // none: a model's first layer
  for (const auto& [view, name] : views) {
    if ((view == &residual && !has_residual) || (view == &x && x_made_later)) continue;
    if (view->numel() > 0 && view->data == nullptr) return bad(name, " is null");
    if (!view->is_contiguous()) return bad(name, " is not contiguous");
  }
  if (has_residual && !residual.same_layout(x))
    return bad("residual's dtype or shape differs from x's");
  if (!residual_out.same_layout(x)) return bad("residual_out's dtype or shape differs from x's");
  if ((gamma.dtype != x.dtype && gamma.dtype != DType::kF32) || gamma.numel() != hidden)
    return bad("gamma must hold ", hidden, " elements of ", to_string(x.dtype),
               x.dtype == DType::kF32 ? "" : " or float", " (it holds ", gamma.numel(), " of ",
               to_string(gamma.dtype), ")");
  if (weight != NormWeight::kGamma && weight != NormWeight::kOnePlusGamma)
    return bad("weight ", static_cast<int>(weight), " is not a NormWeight");
  TensorView norm_shape = norm_out;
  norm_shape.dtype = x.dtype;
  if (!norm_shape.same_layout(x)) return bad("norm_out's shape differs from x's");
  if (!std::isfinite(eps) || eps < 0) return bad("eps ", eps, " is not a finite number >= 0");
  const std::int64_t rows = x.numel() / hidden;

  using kernels::Fusion;
  Fusion kind = Fusion::kAddRmsNorm;
  const float* scale = nullptr;
  float* row_scales = nullptr;
  const bool has_rows = fp8.row_scales.data != nullptr;
  const bool has_groups = fp8.group_scales.data != nullptr;
  const int given = (fp8.scale.data != nullptr ? 1 : 0) + (has_rows ? 1 : 0) + (has_groups ? 1 : 0);
  TensorView scales;  // the written ones
  if (norm_out.dtype == DType::kF8E4M3) {
    if (given > 1) return bad("give one of the per-tensor, row and group scales, not several");
    if (fp8.scale.data != nullptr) {
      if (fp8.scale.dtype != DType::kF32 || fp8.scale.numel() != 1)
        return bad("the FP8 scale must be one f32 element");
      kind = Fusion::kAddRmsNormFp8;
      scale = static_cast<const float*>(fp8.scale.data);
    } else if (has_rows) {
      if (fp8.row_scales.dtype != DType::kF32 || fp8.row_scales.numel() != rows ||
          !fp8.row_scales.is_contiguous())
        return bad("the FP8 row scales must be ", rows, " contiguous f32 elements");
      kind = Fusion::kAddRmsNormFp8Token;
      scales = fp8.row_scales;
    } else if (has_groups) {
      if (hidden % kernels::kFp8Group != 0)
        return bad("FP8 group scales take a hidden size that is a multiple of ", kernels::kFp8Group,
                   " (it is ", hidden, ")");
      const std::int64_t groups = rows * (hidden / kernels::kFp8Group);
      if (fp8.group_scales.dtype != DType::kF32 || fp8.group_scales.numel() != groups ||
          !fp8.group_scales.is_contiguous())
        return bad("the FP8 group scales must be ", groups, " contiguous f32 elements (", rows,
                   " rows of ", hidden / kernels::kFp8Group, " groups)");
      kind = Fusion::kAddRmsNormFp8Group;
      scales = fp8.group_scales;
    } else {
      return bad("norm_out is f8e4m3: give its per-tensor scale, row scales or group scales");
    }
    row_scales = static_cast<float*>(scales.data);
  } else if (norm_out.dtype != x.dtype) {
    return bad("norm_out is ", to_string(norm_out.dtype), "; ", to_string(x.dtype),
               " (x's) or f8e4m3 expected");
  } else if (given > 0) {
    return bad("FP8 scales given, but norm_out is ", to_string(norm_out.dtype));
  }
  if (overlaps(norm_out, residual_out)) return bad("norm_out overlaps residual_out");
  if (overlaps(residual_out, residual) && residual_out.data != residual.data)
    return bad("residual_out overlaps residual without being it (in place)");
  if (overlaps(norm_out, x) && norm_out.data != x.data)
    return bad("norm_out overlaps x without being it (in place)");
  if (overlaps(norm_out, residual)) return bad("norm_out overlaps residual");
  if (overlaps(residual_out, x)) return bad("residual_out overlaps x");
  if (overlaps(residual_out, gamma) || overlaps(norm_out, gamma))
    return bad("an output overlaps gamma");
  if (row_scales != nullptr) {
    for (const TensorView* v : {&x, &residual, &norm_out, &residual_out, &gamma})
      if (overlaps(scales, *v)) return bad("the FP8 scales overlap a tensor");
  }

  call->fusion = kernels::FusionParams{kind,
                                       has_residual ? residual.data : nullptr,
                                       gamma.data,
                                       norm_out.data,
                                       scale,
                                       row_scales,
                                       eps,
                                       hidden,
                                       /*gamma_f32=*/gamma.dtype != x.dtype,
                                       /*gamma_plus_one=*/weight == NormWeight::kOnePlusGamma,
                                       /*moe=*/{}};
  call->rows = rows;
  call->dtype = x.dtype;
  call->x = x;
  call->residual = residual;
  call->norm_out = norm_out;
  call->residual_out = residual_out;
  return Status::kOk;
}

Status make_all_reduce_add_rmsnorm(const GroupShape& g, const TensorView& x,
                                   const TensorView& residual, const TensorView& gamma, float eps,
                                   const TensorView& norm_out, const TensorView& residual_out,
                                   const Fp8Scales& fp8, NormWeight weight, Call* call,
                                   bool x_made_later) noexcept {
  constexpr const char* kOp = "all_reduce_add_rmsnorm";
  AddRmsNormCall& c = call->norm.emplace();
  if (Status s = check_add_rmsnorm(x, residual, gamma, eps, norm_out, residual_out, fp8, weight,
                                   kOp, &c, &call->message, x_made_later);
      s != Status::kOk)
    return s;
  for (const TensorView* v : {&x, &residual, &gamma, &norm_out, &residual_out})
    if ((v->data != nullptr || v != &residual) && !(v == &x && x_made_later))
      TPCOMM_TRY(check_view(g, *v, "a tensor", kOp, call));
  call->empty = c.rows == 0;
  Request& req = call->request;
  Reduce sum;
  sum.fusion = &c.fusion;
  sum.residual = &c.residual;
  sum.norm_out = &c.norm_out;
  req = Request{Op::kAllReduceAddRmsNorm, x, residual_out, sum};
  req.tag.fingerprint = fingerprint(
      Op::kAllReduceAddRmsNorm, x.dtype, x.numel(),
      fused_shape(static_cast<int>(c.fusion.kind), norm_form(c.fusion), c.fusion.hidden));
  return Status::kOk;
}

Status make_reduce_scatter_add_rmsnorm(const GroupShape& g, const TensorView& x,
                                       const TensorView& residual, const TensorView& gamma,
                                       float eps, const TensorView& norm_out,
                                       const TensorView& residual_out, const Fp8Scales& fp8,
                                       NormWeight weight, Call* call) noexcept {
  constexpr const char* kOp = "reduce_scatter_add_rmsnorm";
  TPCOMM_TRY(check_view(g, x, "x", kOp, call));
  if (x.ndim != 2 || x.shape[1] < 1)
    return refuse(call, detail::concat(kOp, ": x must be [tokens, hidden], not ", x.ndim, "-d"));
  const std::int64_t tokens = x.shape[0];
  const std::int64_t hidden = x.shape[1];
  if (tokens % g.world != 0)
    return refuse(call, detail::concat(kOp, ": ", tokens, " tokens do not split evenly over ",
                                       g.world, " ranks (pad them to a multiple)"));
  for (const TensorView* v : {&residual, &norm_out, &residual_out})
    if (overlaps(*v, x))
      return refuse(call, detail::concat(kOp, ": an output or the residual overlaps x"));
  // This rank's rows of x: what the epilogue's checks see (its outputs hold these rows).
  const std::int64_t rows = tokens / g.world;
  const TensorView mine = TensorView::contiguous(
      static_cast<char*>(x.data) +
          g.rank * rows * hidden * static_cast<std::int64_t>(dtype_size(x.dtype)),
      x.dtype, {rows, hidden}, x.device);
  AddRmsNormCall& c = call->norm.emplace();
  if (Status s = check_add_rmsnorm(mine, residual, gamma, eps, norm_out, residual_out, fp8, weight,
                                   kOp, &c, &call->message);
      s != Status::kOk)
    return s;
  for (const TensorView* v : {&residual, &gamma, &norm_out, &residual_out})
    if (v->data != nullptr || v != &residual) TPCOMM_TRY(check_view(g, *v, "a tensor", kOp, call));
  call->empty = tokens == 0;
  Reduce sum{ReduceOp::kSum, /*scattered=*/true};
  sum.fusion = &c.fusion;
  sum.residual = &c.residual;
  sum.norm_out = &c.norm_out;
  call->request = Request{Op::kReduceScatterAddRmsNorm, x, residual_out, sum};
  call->request.tag.fingerprint = fingerprint(
      Op::kReduceScatterAddRmsNorm, x.dtype, x.numel(),
      fused_shape(static_cast<int>(c.fusion.kind), norm_form(c.fusion), c.fusion.hidden));
  return Status::kOk;
}

}  // namespace tpcomm
