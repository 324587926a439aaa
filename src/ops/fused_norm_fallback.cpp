// SPDX-License-Identifier: Apache-2.0
// `add_rmsnorm` on its own (the checks, then the local kernel), and the fused operation's path
// where no fused kernel serves it (`make_unfused_norm_backend` in ops/fused_norm.hpp).
#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"
#include "core/log.hpp"
#include "core/overlap.hpp"
#include "kernels/kernels.hpp"
#include "ops/call.hpp"
#include "ops/composite.hpp"
#include "ops/fused_norm.hpp"
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

namespace {

class UnfusedNorm final : public Composite {
 public:
  UnfusedNorm(BackendChain& chain, const GroupShape& g) noexcept
      : Composite(chain, Op::kAllReduceAddRmsNorm, "only the fused norm", "all_reduce_add_rmsnorm",
                  "", "+add_rmsnorm"),
        g_(g) {}

  std::string_view name() const noexcept override { return "all_reduce+add_rmsnorm"; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const TensorView& x = r.in;
    const TensorView& residual_out = r.out;
    const std::int64_t count = x.numel();
    const Reduce& fused = *r.reduce();
    kernels::FusionParams f = *fused.fusion;
    auto all_reduce = [&](const TensorView& in, const TensorView& out) {
      return run_inner(inner(r, Op::kAllReduce, in, out, Reduce{}), plan, stream);
    };
    auto local = [&](const void* sum) {
      const Status s =
          kernels::launch_add_rmsnorm(sum, residual_out.data, f, count, x.dtype, stream);
      return s == Status::kOk ? s : failed(s, "the local add + RMSNorm failed");
    };
    // The sum goes where it destroys nothing the local kernel still needs.
    const TensorView& norm_out = *fused.norm_out;
    const TensorView& residual = *fused.residual;
    if (norm_out.dtype == x.dtype && !overlaps(norm_out, residual)) {
      TPCOMM_TRY(all_reduce(x, norm_out));
      return local(norm_out.data);
    }
    if (!overlaps(residual_out, residual)) {
      TPCOMM_TRY(all_reduce(x, residual_out));
      return local(residual_out.data);
    }
    // f8e4m3 norm_out and residual_out == residual: rank 0 adds the residual (the same on every
    // rank) into residual_out, the others put x there, and the all-reduce sums that in place.
    if (g_.rank == 0) {
      kernels::FusionParams add = f;
      add.kind = kernels::Fusion::kAdd;
      if (Status s =
              kernels::launch_add_rmsnorm(x.data, residual_out.data, add, count, x.dtype, stream);
          s != Status::kOk)
        return failed(s, "the local residual add failed");
    } else if (cudaMemcpyAsync(residual_out.data, x.data, static_cast<std::size_t>(x.nbytes()),
                               cudaMemcpyDeviceToDevice,
                               reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) {
      return failed(Status::kCudaError, "copying x failed");
    }
    TPCOMM_TRY(all_reduce(residual_out, residual_out));
    f.residual = nullptr;  // added already
    return local(residual_out.data);
  }

 private:
  /// The all-reduce of the fused call's `in`.
  Request planned(const Request& r, ExchangePlan* /*scratch*/) const noexcept override {
    return inner(r, Op::kAllReduce, r.in, r.in, Reduce{});
  }

  GroupShape g_;
};

}  // namespace

std::unique_ptr<Backend> make_unfused_norm_backend(BackendChain& chain, const GroupShape& g) {
  return std::make_unique<UnfusedNorm>(chain, g);
}

}  // namespace tpcomm
