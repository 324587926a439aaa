// SPDX-License-Identifier: Apache-2.0
// The LM head's exchange where the custom exchange does not serve it: the all-gather, then the
// copy of this rank's rows (`make_gather_copy_backend` in ops/exchange.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "ops/composite.hpp"
#include "ops/exchange.hpp"

namespace tpcomm {
namespace {

class GatherCopy final : public Composite {
 public:
  GatherCopy(BackendChain& chain, const GroupShape& g, bool prepares) noexcept
      : Composite(chain, Op::kLmHeadExchange, "only the LM-head exchange", "lm_head_exchange",
                  "all_gather:", "+copy"),
        g_(g),
        prepares_(prepares) {}
  ~GatherCopy() override { cudaFree(prepared_); }
  GatherCopy(const GatherCopy&) = delete;
  GatherCopy& operator=(const GatherCopy&) = delete;

  void prepare(std::int64_t shard_bytes, Stream) override {
    if (!prepares_ || shard_bytes <= 0) return;
    const std::int64_t bytes = g_.world * shard_bytes;
    if (bytes <= prepared_bytes_) return;
    void* grown = nullptr;
    TPCOMM_CUDA_CHECK(cudaMalloc(&grown, static_cast<std::size_t>(bytes)));
    cudaFree(prepared_);  // waits for the device: no call of the old one is in flight after it
    prepared_ = grown;
    prepared_bytes_ = bytes;
  }

  std::string_view name() const noexcept override { return "all_gather+copy"; }

  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    const TensorView& shards = r.in;
    const std::int64_t bytes = g_.world * shards.nbytes();
    // The prepared temporary where it holds them (calls on one group are ordered on its stream),
    // else one of this call's own.
    const bool own = bytes > prepared_bytes_;
    void* gathered = prepared_;
    if (own && cudaMallocAsync(&gathered, static_cast<std::size_t>(bytes), s) != cudaSuccess)
      return failed(Status::kCudaError, "allocating the gathered shards failed");
    ExchangePlan exchange;
    Status status = run_inner(gather(r, gathered, &exchange), plan, stream);
    if (status == Status::kOk) status = copy_rows(r, static_cast<const char*>(gathered), stream);
    if (own && cudaFreeAsync(gathered, s) != cudaSuccess && status == Status::kOk)
      status = failed(Status::kCudaError, "freeing the gathered shards failed");
    return status;
  }

 private:
  Request planned(const Request& r, ExchangePlan* scratch) const noexcept override {
    return gather(r, r.in.data, scratch);
  }

  /// The all-gather of the shards into `gathered` ([world, T, S]).
  Request gather(const Request& r, void* gathered, ExchangePlan* exchange) const noexcept {
    const TensorView flat = r.in.flattened();
    Exchange all{Exchange::Kind::kAllGather};
    if (g_.world >= 2 && g_.world <= kMaxRanks) {
      *exchange = plan_all_gather(flat.nbytes(), g_.world, g_.rank);
      all.plan = exchange;
    }
    return inner(r, Op::kAllGather, flat,
                 TensorView::flat(gathered, flat.dtype, g_.world * flat.numel(), g_.device), all);
  }

  /// This rank's rows of every shard into their columns: one launch per `kMaxRanks` shards.
  Status copy_rows(const Request& r, const char* gathered, Stream stream) noexcept {
    const TensorView& shards = r.in;
    const std::int64_t cols = shards.shape[1];
    const std::int64_t vocab = r.out.shape[1];
    const std::int64_t rows = r.out.shape[0];
    const auto elem = static_cast<std::int64_t>(dtype_size(shards.dtype));
    std::int64_t first = 0;
    const LmHeadLayout& layout = *r.exchange()->layout;
    for (int q = 0; q < g_.rank; ++q) first += layout.rows_of(q);
    for (int base = 0; base < g_.world && rows > 0; base += kMaxRanks) {
      kernels::RegionCopyParams copy{};
      copy.output = r.out.data;
      copy.regions = std::min(kMaxRanks, g_.world - base);
      for (int i = 0; i < copy.regions; ++i) {
        const std::int64_t shard = base + i;
        copy.sources[i] = gathered + shard * shards.nbytes();
        copy.from[i] = {
            first * cols * elem, cols * elem, shard * cols * elem,
            vocab * elem,        rows,        lm_head_columns(shard, cols, vocab) * elem};
      }
      if (Status c = kernels::launch_region_copy(copy, stream); c != Status::kOk)
        return failed(c, "copying the local rows failed");
    }
    return Status::kOk;
  }

  GroupShape g_;
  bool prepares_;
  void* prepared_ = nullptr;
  std::int64_t prepared_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_gather_copy_backend(BackendChain& chain, const GroupShape& g,
                                                  bool prepares) {
  return std::make_unique<GatherCopy>(chain, g, prepares);
}

}  // namespace tpcomm
