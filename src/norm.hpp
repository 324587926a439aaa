// SPDX-License-Identifier: Apache-2.0
// The checks and the local kernel launch shared by `add_rmsnorm` and the fused all-reduce.
#pragma once

#include <string>

#include "kernels/kernels.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm {

/// A checked residual add + RMSNorm: its epilogue arguments (`fusion.kind` is one of the
/// `kAddRmsNorm*`), rows and dtype.
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
                         const Fp8Scales& fp8, const char* op, AddRmsNormCall* call,
                         std::string* message) noexcept;

/// `kind` with its quantisation, without the residual add (`kRmsNorm*`) or without the norm
/// (`kAdd`).
kernels::Fusion without_residual(kernels::Fusion kind) noexcept;

/// True when the byte ranges of `a` and `b` intersect (an empty view intersects nothing).
bool overlaps(const TensorView& a, const TensorView& b) noexcept;

}  // namespace tpcomm
