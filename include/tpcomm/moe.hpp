// SPDX-License-Identifier: Apache-2.0
// The MoE layer's combine: on its own here, before the all-reduce + residual add + RMSNorm in
// `Group::moe_finalize_all_reduce_add_rmsnorm`.
#pragma once

#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

/// A tensor-parallel MoE layer's partial output before its all-reduce: every token's top-k
/// expert outputs, weighted by the router, plus the shared expert's output.
struct MoeCombine {
  /// `[rows, hidden]`, f16, bf16 or f32: the experts' outputs in the MoE kernel's (permuted)
  /// order.
  TensorView experts;
  /// int32 `[tokens, top_k]` (top_k 1..32): the row of `experts` holding token t's k-th expert
  /// output. Rows may repeat or never be chosen. An entry outside [0, rows) makes that token's
  /// outputs NaN (it is read on the device, so it cannot be refused up front).
  TensorView map;
  /// `[tokens, top_k]`, f32 or the experts' dtype: the router's weights.
  TensorView weights;
  /// `[tokens, hidden]` in the experts' dtype, or empty (a null `data`): the shared expert's
  /// output.
  TensorView shared;
};

/// `out[t] = sum over k of weights[t, k] * experts[map[t, k]] + shared[t]`, on `stream`: per
/// element, the products and sums in f32 in that order (k ascending, the shared expert last),
/// rounded once into `out`'s dtype (the experts'). `out` is `[tokens, hidden]`, contiguous like
/// every input, and overlaps none of them. kInvalidArgument (the reason in the log) for anything
/// else; kCudaError when the launch fails.
[[nodiscard]] Status moe_combine(const MoeCombine& moe, const TensorView& out,
                                 Stream stream) noexcept;

}  // namespace tpcomm
