// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce's tuner: every candidate of the registry timed in CUDA graphs.
#include <algorithm>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "backends/custom_ar_impl.hpp"
#include "backends/exchange_plan.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "tune/graph_timer.hpp"
#include "tune/tuner.hpp"

namespace tpcomm {

TuneTable CustomAllReduce::tune(const TuneKey& key) {
  constexpr int kOpsPerGraph = 20;
  constexpr int kReplays = 5;
  Impl& m = *impl_;
  DeviceGuard guard(m.device);
  struct Resources {
    // The input, the output (residual_out), and the fused operation's residual, gamma, norm_out.
    std::array<void*, 5> buffers{};
    cudaStream_t stream = nullptr;
    ~Resources() {
      for (void* p : buffers) cudaFree(p);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  } r;
  const auto most = static_cast<std::size_t>(std::max(caps_.max_bytes, caps_.exchange_max_bytes));
  for (void*& p : r.buffers) {
    TPCOMM_CUDA_CHECK(cudaMalloc(&p, most));
    TPCOMM_CUDA_CHECK(cudaMemset(p, 0, most));
  }
  void* in = r.buffers[0];
  void* out = r.buffers[1];
  TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const auto stream = reinterpret_cast<Stream>(r.stream);
  if (Status w = warm_up(stream); w != Status::kOk) TPCOMM_THROW(w, "tuning: ", error_message_);
  // Never time on zeros: every bf16 element 0x3c3c (about 0.0115), a finite normal number that
  // is not the Lamport kernels' empty mark.
  TPCOMM_CUDA_CHECK(cudaMemsetAsync(in, 0x3c, static_cast<std::size_t>(caps_.max_bytes), r.stream));
  // `kOpsPerGraph` launches of `launch()` captured, replayed and timed: microseconds each.
  auto time_ops = [&](const auto& c, auto&& launch) {
    GraphTimer graph(stream);  // destroyed on return, before the collective that follows
    std::string failure = graph.capture([&] {
      for (int i = 0; i < kOpsPerGraph; ++i)
        if (Status s = launch(); s != Status::kOk)
          return detail::concat("launching ", to_string(c), " failed: ", to_string(s));
      return std::string();
    });
    double us = 0;
    if (failure.empty()) failure = graph.time(*m.boot, kReplays, &us);
    if (Status h = health(); h != Status::kOk) TPCOMM_THROW(h, "tuning: ", error_message_);
    TPCOMM_CHECK(failure.empty(), Status::kCudaError, "tuning: ", failure);
    return us / kOpsPerGraph;
  };
  auto time = [&](const Choice& c, std::int64_t bytes) {
    const auto iv = TensorView::flat(in, DType::kBF16, bytes / 2, m.device);
    const auto ov = TensorView::flat(out, DType::kBF16, bytes / 2, m.device);
    const CallTag tag{fingerprint(Op::kAllReduce, DType::kBF16, bytes / 2)};
    return time_ops(c, [&] { return run(iv, ov, c, /*capturing=*/false, stream, tag); });
  };
  auto time_fused = [&](const Choice& c, std::int64_t bytes) {
    const std::int64_t hidden = tune_fused_hidden(bytes);
    const std::int64_t count = std::max<std::int64_t>(1, bytes / 2 / hidden) * hidden;
    kernels::FusionParams f{};
    f.kind = kernels::Fusion::kAddRmsNorm;
    f.residual = r.buffers[2];
    f.gamma = r.buffers[3];
    f.norm_out = r.buffers[4];
    f.eps = 1e-6f;
    f.hidden = hidden;
    const auto iv = TensorView::flat(in, DType::kBF16, count, m.device);
    const auto ov = TensorView::flat(out, DType::kBF16, count, m.device);
    const CallTag tag{fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, count,
                                  fused_shape(static_cast<int>(f.kind), 0, hidden))};
    if (c.algo != Algo::kNone)
      return time_ops(c, [&] { return run(iv, ov, c, /*capturing=*/false, stream, tag, &f); });
    // The fallback: the built-in all-reduce into residual_out, then the local kernel there.
    const Choice reduce =
        select_all_reduce(count * 2, DType::kBF16, ReduceOp::kSum, caps_, {}, nullptr);
    TPCOMM_CHECK(reduce.algo != Algo::kNone, Status::kInternal, "tuning: no all-reduce for ",
                 count * 2, " bytes");
    return time_ops(c, [&] {
      TPCOMM_TRY(run(iv, ov, reduce, /*capturing=*/false, stream, tag));
      return kernels::launch_add_rmsnorm(out, out, f, count, DType::kBF16, stream);
    });
  };
  // The exchanges: an equal-split all-to-all whose every rank's input is `bytes` (in whole
  // 16-byte accesses per chunk).
  auto time_exchange = [&](const ExchangeChoice& c, std::int64_t bytes) {
    const std::int64_t chunk = std::max<std::int64_t>(16, bytes / m.world / 16 * 16);
    const ExchangePlan plan = plan_all_to_all(chunk * m.world, m.world, m.rank);
    const auto iv = TensorView::flat(in, DType::kU8, chunk * m.world, m.device);
    const auto ov = TensorView::flat(out, DType::kU8, chunk * m.world, m.device);
    const CallTag tag{fingerprint(Op::kAllToAll, DType::kU8, chunk * m.world)};
    return time_ops(c, [&] { return exchange(plan, iv, ov, c, /*capturing=*/false, stream, tag); });
  };
  TuneTable plain = tune_all_reduce(caps_, *m.boot, key, time);
  std::vector<TuneEntry> fused = tune_fused(caps_, *m.boot, time_fused);
  return TuneTable(key, plain.entries(), std::move(fused),
                   tune_exchange(caps_, *m.boot, time_exchange));
}

}  // namespace tpcomm
