// SPDX-License-Identifier: Apache-2.0
// `add_rmsnorm` on its own: the checks, then the local kernel.
#include <string>

#include "core/log.hpp"
#include "kernels/kernels.hpp"
#include "norm.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm {

Status add_rmsnorm(const TensorView& x, const TensorView& residual, const TensorView& gamma,
                   float eps, const TensorView& norm_out, const TensorView& residual_out,
                   Stream stream, const Fp8Scales& fp8, NormWeight weight) noexcept {
  AddRmsNormCall call;
  std::string message;
  if (Status s = check_add_rmsnorm(x, residual, gamma, eps, norm_out, residual_out, fp8, weight,
                                   "add_rmsnorm", &call, &message);
      s != Status::kOk) {
    TPCOMM_LOG_ERROR(message);
    return s;
  }
  if (call.rows == 0) return Status::kOk;
  return kernels::launch_add_rmsnorm(x.data, residual_out.data, call.fusion, x.numel(), x.dtype,
                                     stream);
}

}  // namespace tpcomm
