// SPDX-License-Identifier: Apache-2.0
#include "ops/moe.hpp"

#include "backends/fingerprint.hpp"
#include "core/check.hpp"
#include "core/overlap.hpp"
#include "ops/call.hpp"

namespace tpcomm {

Status check_moe_combine(const MoeCombine& moe, const TensorView& out, const char* op,
                         kernels::MoeCombineParams* params, std::string* message) noexcept {
  auto bad = [&](auto&&... what) {
    *message = detail::concat(op, ": ", what...);
    return Status::kInvalidArgument;
  };
  const TensorView& e = moe.experts;
  if (e.dtype != DType::kF16 && e.dtype != DType::kBF16 && e.dtype != DType::kF32)
    return bad("experts is ", to_string(e.dtype), "; f16, bf16 or f32 expected");
  if (e.ndim != 2) return bad("experts must be [rows, hidden] (it has ", e.ndim, " dimensions)");
  const std::int64_t rows = e.shape[0];
  const std::int64_t hidden = e.shape[1];
  if (hidden > kernels::kMoeMaxHidden)
    return bad("hidden is ", hidden, "; at most ", kernels::kMoeMaxHidden, " supported");
  if (moe.map.dtype != DType::kI32 || moe.map.ndim != 2)
    return bad("map must be int32 [tokens, top_k] (it is ", to_string(moe.map.dtype), " with ",
               moe.map.ndim, " dimensions)");
  const std::int64_t tokens = moe.map.shape[0];
  const std::int64_t top_k = moe.map.shape[1];
  if (top_k < 1 || top_k > kernels::kMoeMaxTopK)
    return bad("top_k is ", top_k, "; 1 to ", kernels::kMoeMaxTopK, " expected");
  const TensorView& w = moe.weights;
  if ((w.dtype != DType::kF32 && w.dtype != e.dtype) || w.ndim != 2 || w.shape[0] != tokens ||
      w.shape[1] != top_k)
    return bad("weights must be [", tokens, ", ", top_k, "] of f32 or ", to_string(e.dtype),
               " (they are ", to_string(w.dtype), ", ", w.numel(), " elements)");
  const bool has_shared = moe.shared.data != nullptr;
  if (has_shared && (moe.shared.dtype != e.dtype || moe.shared.numel() != tokens * hidden ||
                     moe.shared.ndim < 1 || moe.shared.shape[moe.shared.ndim - 1] != hidden))
    return bad("shared must be [", tokens, ", ", hidden, "] of ", to_string(e.dtype));
  if (out.dtype != e.dtype || out.numel() != tokens * hidden || out.ndim < 1 ||
      out.shape[out.ndim - 1] != hidden)
    return bad("the combined output must be [", tokens, ", ", hidden, "] of ", to_string(e.dtype));
  const struct {
    const TensorView* view;
    const char* name;
  } inputs[] = {{&e, "experts"}, {&moe.map, "map"}, {&w, "weights"}, {&moe.shared, "shared"}};
  for (const auto& [view, name] : inputs) {
    if (view == &moe.shared && !has_shared) continue;
    if (view->numel() > 0 && view->data == nullptr) return bad(name, " is null");
    if (!view->is_contiguous()) return bad(name, " is not contiguous");
    if (view->device >= 0 && out.device >= 0 && view->device != out.device)
      return bad(name, " is on another device than the output");
    if (out.data != nullptr && overlaps(*view, out)) return bad("the output overlaps ", name);
  }
  if (tokens > 0 && rows == 0) return bad("experts has no rows for the map to name");
  *params =
      kernels::MoeCombineParams{e.data,
                                static_cast<const std::int32_t*>(moe.map.data),
                                w.data,
                                has_shared ? moe.shared.data : nullptr,
                                out.data,
                                tokens,
                                rows,
                                hidden,
                                static_cast<int>(top_k),
                                /*weights_f32=*/w.dtype == DType::kF32 && e.dtype != DType::kF32};
  return Status::kOk;
}

Status make_moe_finalize(const GroupShape& g, const MoeCombine& moe, const TensorView& residual,
                         const TensorView& gamma, float eps, const TensorView& norm_out,
                         const TensorView& residual_out, const Fp8Scales& fp8, NormWeight weight,
                         Call* call) noexcept {
  constexpr const char* kOp = "moe_finalize_all_reduce_add_rmsnorm";
  TensorView x = norm_out;
  x.dtype = moe.experts.dtype;
  bool into_norm_out = norm_out.dtype == moe.experts.dtype;
  for (const TensorView* v : {&moe.experts, &moe.map, &moe.weights, &moe.shared, &residual, &gamma})
    into_norm_out = into_norm_out && !overlaps(*v, norm_out);
  if (!into_norm_out) x.data = nullptr;
  kernels::MoeCombineParams& combine = call->moe.emplace();
  TPCOMM_TRY(check_moe_combine(moe, x, kOp, &combine, &call->message));
  for (const TensorView* v : {&moe.experts, &moe.map, &moe.weights, &moe.shared})
    if (v->data != nullptr || v != &moe.shared)
      TPCOMM_TRY(check_view(g, *v, "a tensor", kOp, call));
  TPCOMM_TRY(make_all_reduce_add_rmsnorm(g, x, residual, gamma, eps, norm_out, residual_out, fp8,
                                         weight, call, /*x_made_later=*/!into_norm_out));
  if (call->empty) return Status::kOk;
  Request& req = call->request;
  req.op = Op::kMoeFinalize;
  auto* sum = std::get_if<Reduce>(&req.args);  // the fused norm's, made above
  if (sum == nullptr) return Status::kInternal;
  sum->moe = &combine;
  const kernels::FusionParams& f = *sum->fusion;
  req.tag.fingerprint = fingerprint(Op::kMoeFinalize, x.dtype, x.numel(),
                                    fused_shape(static_cast<int>(f.kind), norm_form(f), f.hidden));
  return Status::kOk;
}

}  // namespace tpcomm
