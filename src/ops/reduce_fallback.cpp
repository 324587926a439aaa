// SPDX-License-Identifier: Apache-2.0
// The reduce-scatter where no backend serves it: the all-reduce, then the copy of this rank's
// part (`make_reduce_slice_backend` in ops/reduce.hpp).
#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"
#include "ops/reduce.hpp"

namespace tpcomm {
namespace {

class ReduceSlice final : public Backend {
 public:
  ReduceSlice(BackendChain& chain, const GroupShape& g) noexcept : chain_(chain), g_(g) {}

  std::string_view name() const noexcept override { return "all_reduce+slice"; }

  Plan plan(const Request& r) const noexcept override {
    if (r.op != Op::kReduceScatter) return Plan::no("only the reduce-scatter");
    const Plan inner = chain_.plan(reduce(r, r.in.data));
    if (!inner.ok()) return Plan::no(inner.refusal);
    return Plan::yes({this}, inner.step);
  }

  std::string describe(const Plan& plan) const override {
    return BackendChain::describe(Plan::yes(plan.inner)) + "+slice";
  }

  std::string last_error() const override { return error_; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    const auto bytes = static_cast<std::size_t>(r.in.nbytes());
    void* sum = nullptr;
    if (cudaMallocAsync(&sum, bytes, s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the reduced input failed");
    const Backend* served = nullptr;
    Status status = chain_.run(reduce(r, sum), Plan::yes(plan.inner), stream, &served);
    if (status != Status::kOk) {
      error_ = served != nullptr ? served->last_error() : std::string();
    } else {
      const auto part = static_cast<std::size_t>(r.out.nbytes());
      if (cudaMemcpyAsync(r.out.data, static_cast<const char*>(sum) + g_.rank * part, part,
                          cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        status = failed(Status::kCudaError, "copying this rank's part failed");
    }
    if (cudaFreeAsync(sum, s) != cudaSuccess && status == Status::kOk)
      status = failed(Status::kCudaError, "freeing the reduced input failed");
    return status;
  }

 private:
  /// The all-reduce of the call's whole input into `sum`, with the call's op and tag.
  static Request reduce(const Request& r, void* sum) noexcept {
    const TensorView flat = r.in.flattened();
    Request req{Op::kAllReduce, flat, TensorView::flat(sum, flat.dtype, flat.numel(), flat.device),
                r.reduce};
    req.capturing = r.capturing;
    req.tag = r.tag;
    return req;
  }

  Status failed(Status s, const char* what) noexcept {
    error_ = detail::concat("reduce_scatter: ", what);
    return s;
  }

  BackendChain& chain_;
  GroupShape g_;
  std::string error_;
};

}  // namespace

std::unique_ptr<Backend> make_reduce_slice_backend(BackendChain& chain, const GroupShape& g) {
  return std::make_unique<ReduceSlice>(chain, g);
}

}  // namespace tpcomm
