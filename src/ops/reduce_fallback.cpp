// SPDX-License-Identifier: Apache-2.0
// The reduce-scatter where no backend serves it: the all-reduce, then the copy of this rank's
// part (`make_reduce_slice_backend` in ops/reduce.hpp).
#include <cuda_runtime.h>

#include <string>

#include "ops/composite.hpp"
#include "ops/reduce.hpp"

namespace tpcomm {
namespace {

class ReduceSlice final : public Composite {
 public:
  ReduceSlice(BackendChain& chain, const GroupShape& g) noexcept
      : Composite(chain, Op::kReduceScatter, "only the reduce-scatter", "reduce_scatter", "",
                  "+slice"),
        g_(g) {}

  std::string_view name() const noexcept override { return "all_reduce+slice"; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    const auto bytes = static_cast<std::size_t>(r.in.nbytes());
    void* sum = nullptr;
    if (cudaMallocAsync(&sum, bytes, s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the reduced input failed");
    Status status = run_inner(reduce(r, sum), plan, stream);
    if (status == Status::kOk) {
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
  Request planned(const Request& r, ExchangePlan* /*scratch*/) const noexcept override {
    return reduce(r, r.in.data);
  }

  /// The all-reduce of the call's whole input into `sum`, with the call's op.
  static Request reduce(const Request& r, void* sum) noexcept {
    const TensorView flat = r.in.flattened();
    return inner(r, Op::kAllReduce, flat,
                 TensorView::flat(sum, flat.dtype, flat.numel(), flat.device),
                 Reduce{r.reduce()->op});
  }

  GroupShape g_;
};

}  // namespace

std::unique_ptr<Backend> make_reduce_slice_backend(BackendChain& chain, const GroupShape& g) {
  return std::make_unique<ReduceSlice>(chain, g);
}

}  // namespace tpcomm
