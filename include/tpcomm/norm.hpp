// SPDX-License-Identifier: Apache-2.0
// Residual add + RMSNorm (+ FP8 quantisation): on its own here, fused with the all-reduce in
// `Group::all_reduce_add_rmsnorm`.
#pragma once

#include <cstdint>

#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

/// The scales of an f8e4m3 `norm_out`: exactly one of the three, f32 in device memory.
struct Fp8Scales {
  /// One element, read when the operation runs: `norm_out = saturate(value / scale)` (the static
  /// per-tensor scale of FP8 checkpoints).
  TensorView scale;
  /// `[tokens]`, written: each row's scale `max(|value|) / 448` (at least 1 / (448 * 512)), and
  /// `norm_out = saturate(value / row scale)` (dynamic per-token quantisation).
  TensorView row_scales;
  /// `[tokens, hidden / 128]`, written: the same per group of 128 consecutive elements of a row
  /// (DeepSeek's block quantisation); `hidden` must be a multiple of 128.
  TensorView group_scales;
};

/// What multiplies the normalised row.
enum class NormWeight : std::uint8_t {
  kGamma,         // `gamma` (Llama, DeepSeek, Qwen, ...)
  kOnePlusGamma,  // `1 + gamma` (Gemma's RMSNorm, whose checkpoints store the offset)
};

/// The local half of the fused operation, on `stream`: `residual_out = x + residual` and
/// `norm_out = residual_out * rsqrt(mean(residual_out^2) + eps) * gamma` (or `1 + gamma`, with
/// `weight`), per row of the last dimension (`hidden`), with the add, the mean of squares and the
/// products in fp32 and the norm computed from the stored (rounded) `residual_out`.
///
/// `x`, `residual`, `residual_out` and `norm_out` have one shape (`[tokens, hidden]`, or any
/// shape whose last dimension is `hidden`), are contiguous and f16, bf16 or f32. `residual` may
/// be empty (a null `data`: a model's first layer), and `residual_out` is then `x` itself.
/// `gamma` has `hidden` elements of the input's dtype, or f32 (a norm weight kept in full
/// precision while activations are 16-bit). `norm_out` has the input's dtype, or f8e4m3 with
/// `fp8` giving its scale. In place is allowed as engines call it: `residual_out` may be
/// `residual` and `norm_out` may be `x`; no other two may overlap. Any alignment and any
/// `hidden`. kInvalidArgument (with the reason in the log) for anything else; kCudaError when the
/// launch fails.
[[nodiscard]] Status add_rmsnorm(const TensorView& x, const TensorView& residual,
                                 const TensorView& gamma, float eps, const TensorView& norm_out,
                                 const TensorView& residual_out, Stream stream,
                                 const Fp8Scales& fp8 = {},
                                 NormWeight weight = NormWeight::kGamma) noexcept;

}  // namespace tpcomm
