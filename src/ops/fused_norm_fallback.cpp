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

/// A fused sum (`Reduce::fusion`, no prologue): the sum alone through the chain, scattered or
/// not as the call is (`whole_sum`: a scattered one as the all-reduce of every row, which the
/// custom kernels serve in a deterministic group), then the local add + RMSNorm of the rows this
/// rank holds.
class UnfusedNorm final : public Composite {
 public:
  UnfusedNorm(BackendChain& chain, const GroupShape& g, bool whole_sum) noexcept
      : Composite(chain, Op::kAllReduceAddRmsNorm, "only the fused norms", "all_reduce_add_rmsnorm",
                  "", "+add_rmsnorm"),
        g_(g),
        whole_sum_(whole_sum) {}

  std::string_view name() const noexcept override { return "all_reduce+add_rmsnorm"; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const TensorView& x = r.in;
    const TensorView& residual_out = r.out;
    const std::int64_t count = residual_out.numel();  // the rows this rank holds
    const Reduce& fused = *r.reduce();
    kernels::FusionParams f = *fused.fusion;
    auto sum = [&](const TensorView& in, const TensorView& out) {
      return run_inner(reduce(r, in, out), plan, stream);
    };
    auto local = [&](const void* summed) {
      const Status s =
          kernels::launch_add_rmsnorm(summed, residual_out.data, f, count, x.dtype, stream);
      return s == Status::kOk ? s : failed(s, "the local add + RMSNorm failed");
    };
    if (fused.scattered && whole_sum_) return via_temporary(r, plan, stream, f, count);
    // The sum goes where it destroys nothing the local kernel still needs.
    const TensorView& norm_out = *fused.norm_out;
    const TensorView& residual = *fused.residual;
    if (norm_out.dtype == x.dtype && !overlaps(norm_out, residual)) {
      TPCOMM_TRY(sum(x, norm_out));
      return local(norm_out.data);
    }
    if (!overlaps(residual_out, residual)) {
      TPCOMM_TRY(sum(x, residual_out));
      return local(residual_out.data);
    }
    // f8e4m3 norm_out and residual_out == residual.
    if (fused.scattered) return via_temporary(r, plan, stream, f, count);
    // Rank 0 adds the residual (the same on every rank) into residual_out, the others put x
    // there, and the all-reduce sums that in place.
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
    TPCOMM_TRY(sum(residual_out, residual_out));
    f.residual = nullptr;  // added already
    return local(residual_out.data);
  }

 private:
  [[nodiscard]] bool serves(const Request& r) const noexcept override {
    const Reduce* s = r.reduce();
    return s != nullptr && s->fusion != nullptr && s->moe == nullptr;
  }

  /// The sum of the fused call's `in`.
  Request planned(const Request& r, ExchangePlan* /*scratch*/) const noexcept override {
    return reduce(r, r.in, whole(r) ? r.in : r.out);
  }

  /// Whether `r`'s sum is the all-reduce of every row.
  [[nodiscard]] bool whole(const Request& r) const noexcept {
    return !r.reduce()->scattered || whole_sum_;
  }

  /// The sum alone of `in` into `out`: the all-reduce, or the reduce-scatter of a scattered call.
  [[nodiscard]] Request reduce(const Request& r, const TensorView& in,
                               const TensorView& out) const noexcept {
    const bool scattered = !whole(r);
    return inner(r, scattered ? Op::kReduceScatter : Op::kAllReduce, in, out,
                 Reduce{ReduceOp::kSum, scattered});
  }

  /// A scattered call whose sum has no output to go to (its outputs all taken: f8e4m3 norm_out,
  /// residual_out the residual; or the sum of every row): the sum into a temporary of the call's
  /// own (stream-ordered, which graphs capture), then the local add + RMSNorm of this rank's rows
  /// from it.
  Status via_temporary(const Request& r, const Plan& plan, Stream stream,
                       const kernels::FusionParams& f, std::int64_t count) noexcept {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    const TensorView& residual_out = r.out;
    const bool all_rows = whole(r);
    TensorView sum = all_rows ? r.in.flattened() : residual_out;
    if (cudaMallocAsync(&sum.data, static_cast<std::size_t>(sum.nbytes()), s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the sum failed");
    Status status = run_inner(reduce(r, all_rows ? r.in.flattened() : r.in, sum), plan, stream);
    if (status == Status::kOk) {
      const char* mine = static_cast<const char*>(sum.data) +
                         (all_rows ? g_.rank * residual_out.nbytes() : std::int64_t{0});
      status = kernels::launch_add_rmsnorm(mine, residual_out.data, f, count, r.in.dtype, stream);
      if (status != Status::kOk) status = failed(status, "the local add + RMSNorm failed");
    }
    if (cudaFreeAsync(sum.data, s) != cudaSuccess && status == Status::kOk)
      status = failed(Status::kCudaError, "freeing the sum failed");
    return status;
  }

  GroupShape g_;
  bool whole_sum_;
};

}  // namespace

std::unique_ptr<Backend> make_unfused_norm_backend(BackendChain& chain, const GroupShape& g,
                                                   bool whole_sum) {
  return std::make_unique<UnfusedNorm>(chain, g, whole_sum);
}

}  // namespace tpcomm
