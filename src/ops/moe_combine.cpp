// SPDX-License-Identifier: Apache-2.0
// `moe_combine` on its own (the checks, then the kernel), and the MoE finalize's path: the
// combine, then the fused all-reduce + norm through the chain (`make_moe_combine_backend` in
// ops/moe.hpp).
#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"
#include "core/log.hpp"
#include "ops/composite.hpp"
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

// NOTE [the combine's launch]
// The MoE finalize has two paths: the combine as the prologue of the fused Lamport kernel (each
// rank combines its top-k expert rows as it pushes them; one launch, `CustomArBackend`), and the
// combine kernel first, then the fused call (this composite, writing x into `norm_out` where it
// can). In a bench loop the prologue measured faster at 1-8 tokens, but that loop read one expert
// row top-k times (now distinct rows, as a step's are); in whole decode steps it was slower at
// one token (DeepSeek-V3 8% and Qwen3-235B-A22B 23-28% at 8 virtual ranks, slower at tp 2 and 4
// too) and no faster at 128 (docs/PERFORMANCE.md, "The MoE finalize; one path per operation").
// Its reads run in the few blocks of a Lamport launch, the combine kernel's in a grid of its own.
// So the built-in choice is this composite; `TPCOMM_MOE_PROLOGUE=1` takes the prologue.

class MoeCombineFirst final : public Composite {
 public:
  explicit MoeCombineFirst(BackendChain& chain) noexcept
      : Composite(chain, Op::kMoeFinalize, "only the MoE finalize",
                  "moe_finalize_all_reduce_add_rmsnorm", "moe_combine+", "") {}

  std::string_view name() const noexcept override { return "moe_combine"; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    TensorView x = r.in;
    const bool own = x.data == nullptr;
    if (own && cudaMallocAsync(&x.data, static_cast<std::size_t>(x.nbytes()), s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the combined output failed");
    kernels::MoeCombineParams combine = *r.reduce()->moe;
    combine.out = x.data;
    Status status = kernels::launch_moe_combine(combine, x.dtype, stream);
    if (status != Status::kOk)
      status = failed(status, "launching the combine failed");
    else
      status = run_inner(fused(r, x), plan, stream);
    if (own && cudaFreeAsync(x.data, s) != cudaSuccess && status == Status::kOk)
      status = failed(Status::kCudaError, "freeing the combined output failed");
    return status;
  }

 private:
  Request planned(const Request& r, ExchangePlan* /*scratch*/) const noexcept override {
    return fused(r, r.in);
  }

  /// The fused all-reduce + norm of `x`, with the call's arguments.
  static Request fused(const Request& r, const TensorView& x) noexcept {
    Reduce sum = *r.reduce();
    sum.moe = nullptr;
    return inner(r, Op::kAllReduceAddRmsNorm, x, r.out, sum);
  }
};

}  // namespace

std::unique_ptr<Backend> make_moe_combine_backend(BackendChain& chain) {
  return std::make_unique<MoeCombineFirst>(chain);
}

}  // namespace tpcomm
