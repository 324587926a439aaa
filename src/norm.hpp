// SPDX-License-Identifier: Apache-2.0
// The checks and the local kernel launch shared by `add_rmsnorm` and the fused all-reduce.
#pragma once

#include <string>

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
/// kInvalidArgument with `*message` saying what is wrong, prefixed by `op`.
Status check_add_rmsnorm(const TensorView& x, const TensorView& residual, const TensorView& gamma,
                         float eps, const TensorView& norm_out, const TensorView& residual_out,
                         const Fp8Scales& fp8, NormWeight weight, const char* op,
                         AddRmsNormCall* call, std::string* message) noexcept;

/// The bits of the shape word of a fused call's fingerprint that say its form: no residual, an
/// f32 gamma, Gemma's weight (`fused_shape` in backends/fingerprint.hpp).
int norm_form(const kernels::FusionParams& f) noexcept;

/// True when the byte ranges of `a` and `b` intersect (an empty or null view intersects
/// nothing).
bool overlaps(const TensorView& a, const TensorView& b) noexcept;

}  // namespace tpcomm
