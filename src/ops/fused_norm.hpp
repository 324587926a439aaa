// SPDX-License-Identifier: Apache-2.0
// The fused all-reduce + residual add + RMSNorm: the checks it shares with `add_rmsnorm`, its
// request (ops/call.hpp), and its path where no fused kernel serves it.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.hpp"
#include "kernels/kernels.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm {

/// A checked residual add + RMSNorm: its epilogue arguments (`fusion.kind` is one of the
/// `kAddRmsNorm*`; `fusion.residual` null without a residual), rows and dtype.
struct AddRmsNormCall {
  kernels::FusionParams fusion{};
  std::int64_t rows = 0;
  DType dtype = DType::kBF16;
  TensorView x, residual, norm_out, residual_out;
};

/// Checks the arguments of `add_rmsnorm` (the rules are in tpcomm/norm.hpp), filling `*call`.
/// kInvalidArgument with `*message` saying what is wrong, prefixed by `op`. `x_made_later`: `x`
/// has no memory yet (a temporary the call makes), so it may be null and overlaps nothing.
Status check_add_rmsnorm(const TensorView& x, const TensorView& residual, const TensorView& gamma,
                         float eps, const TensorView& norm_out, const TensorView& residual_out,
                         const Fp8Scales& fp8, NormWeight weight, const char* op,
                         AddRmsNormCall* call, std::string* message,
                         bool x_made_later = false) noexcept;

/// The bits of the shape word of a fused call's fingerprint that say its form: no residual, an
/// f32 gamma, Gemma's weight (`fused_shape` in backends/fingerprint.hpp).
int norm_form(const kernels::FusionParams& f) noexcept;

struct Call;
struct GroupShape;

/// `Group::all_reduce_add_rmsnorm` (tpcomm/group.hpp says the rules); `x_made_later` as for
/// `check_add_rmsnorm`.
Status make_all_reduce_add_rmsnorm(const GroupShape& g, const TensorView& x,
                                   const TensorView& residual, const TensorView& gamma, float eps,
                                   const TensorView& norm_out, const TensorView& residual_out,
                                   const Fp8Scales& fp8, NormWeight weight, Call* call,
                                   bool x_made_later = false) noexcept;

/// `Group::reduce_scatter_add_rmsnorm` (tpcomm/group.hpp says the rules): x [tokens, hidden]
/// reduce-scattered by rows, then the add + RMSNorm of this rank's rows, as a scattered `Reduce`
/// with the fused norm's epilogue.
Status make_reduce_scatter_add_rmsnorm(const GroupShape& g, const TensorView& x,
                                       const TensorView& residual, const TensorView& gamma,
                                       float eps, const TensorView& norm_out,
                                       const TensorView& residual_out, const Fp8Scales& fp8,
                                       NormWeight weight, Call* call) noexcept;

/// The fused norms where no fused kernel serves them (every `Reduce` with an epilogue and no
/// prologue), as an entry of `chain`: the sum through the chain — the all-reduce, or the
/// reduce-scatter of a scattered call — into an output that can hold it (else a temporary of the
/// call's own), then the local add + RMSNorm of this rank's rows. `whole_sum` (a deterministic
/// group): a scattered call sums every row by the all-reduce, which the custom kernels serve
/// batch-invariantly, where NCCL's reduce-scatter would not. Which output holds the sum is a
/// local choice, but every rank runs the same sum (same size, dtype and op), so the ranks' paths
/// agree.
[[nodiscard]] std::unique_ptr<Backend> make_unfused_norm_backend(BackendChain& chain,
                                                                 const GroupShape& g,
                                                                 bool whole_sum);

}  // namespace tpcomm
