// SPDX-License-Identifier: Apache-2.0
// `moe_combine` on its own (the checks, then the kernel), and the MoE finalize's path: the
// combine, then the fused all-reduce + norm through the chain (`make_moe_combine_backend` in
// ops/moe.hpp).
#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"
#include "core/log.hpp"
#include "ops/moe.hpp"

namespace tpcomm {

Status moe_combine(const MoeCombine& moe, const TensorView& out, Stream stream) noexcept {
  kernels::MoeCombineParams params{};
  std::string message;
  if (Status s = check_moe_combine(moe, out, "moe_combine", &params, &message); s != Status::kOk) {
    TPCOMM_LOG_ERROR(message);
    return s;
  }
  if (params.tokens == 0 || params.hidden == 0) return Status::kOk;
  if (out.data == nullptr) {
    TPCOMM_LOG_ERROR("moe_combine: the output is null");
    return Status::kInvalidArgument;
  }
  return kernels::launch_moe_combine(params, moe.experts.dtype, stream);
}

namespace {

class MoeCombineFirst final : public Backend {
 public:
  explicit MoeCombineFirst(BackendChain& chain) noexcept : chain_(chain) {}

  std::string_view name() const noexcept override { return "moe_combine"; }

  Plan plan(const Request& r) const noexcept override {
    if (r.op != Op::kMoeFinalize) return Plan::no("only the MoE finalize");
    const Plan inner = chain_.plan(fused(r, r.in));
    if (!inner.ok()) return Plan::no(inner.refusal);
    return Plan::yes({this}, inner.step);
  }

  std::string describe(const Plan& plan) const override {
    return "moe_combine+" + BackendChain::describe(Plan::yes(plan.inner));
  }

  std::string last_error() const override { return error_; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    TensorView x = r.in;
    const bool own = x.data == nullptr;
    if (own && cudaMallocAsync(&x.data, static_cast<std::size_t>(x.nbytes()), s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the combined output failed");
    kernels::MoeCombineParams combine = *r.moe;
    combine.out = x.data;
    Status status = kernels::launch_moe_combine(combine, x.dtype, stream);
    if (status != Status::kOk) {
      status = failed(status, "launching the combine failed");
    } else {
      const Backend* served = nullptr;
      status = chain_.run(fused(r, x), Plan::yes(plan.inner), stream, &served);
      if (status != Status::kOk) error_ = served != nullptr ? served->last_error() : std::string();
    }
    if (own && cudaFreeAsync(x.data, s) != cudaSuccess && status == Status::kOk)
      status = failed(Status::kCudaError, "freeing the combined output failed");
    return status;
  }

 private:
  /// The fused all-reduce + norm of `x`, with the call's arguments and tag.
  static Request fused(const Request& r, const TensorView& x) noexcept {
    Request req{Op::kAllReduceAddRmsNorm, x, r.out};
    req.fusion = r.fusion;
    req.residual = r.residual;
    req.norm_out = r.norm_out;
    req.capturing = r.capturing;
    req.tag = r.tag;
    return req;
  }

  Status failed(Status s, const char* what) noexcept {
    error_ = detail::concat("moe_finalize_all_reduce_add_rmsnorm: ", what);
    return s;
  }

  BackendChain& chain_;
  std::string error_;
};

}  // namespace

std::unique_ptr<Backend> make_moe_combine_backend(BackendChain& chain) {
  return std::make_unique<MoeCombineFirst>(chain);
}

}  // namespace tpcomm
