// SPDX-License-Identifier: Apache-2.0
#include "tune/tuner.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm {
namespace {

constexpr int kOpsPerGraph = 20;
constexpr int kReplays = 5;
/// A candidate within this fraction of the fastest counts as a tie; ties go to fewer blocks
/// (fewer SMs taken from the compute around the all-reduce), as NCCL's symmetric-kernel model
/// does.
constexpr double kTie = 0.03;

/// Frees a graph and its instance at scope exit.
struct GraphGuard {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphGuard() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

/// Microseconds per all-reduce of `count` bf16 elements with `c`, from graph replays.
double time_candidate(CustomAllReduce& ar, Bootstrap& boot, const TensorView& in,
                      const TensorView& out, Choice c, cudaStream_t s, cudaEvent_t start,
                      cudaEvent_t stop) {
  GraphGuard g;
  TPCOMM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  Status launched = Status::kOk;
  for (int i = 0; i < kOpsPerGraph && launched == Status::kOk; ++i)
    launched = ar.run(in, out, c, /*capturing=*/false, reinterpret_cast<Stream>(s));
  const cudaError_t ended = cudaStreamEndCapture(s, &g.graph);
  TPCOMM_CHECK(launched == Status::kOk, launched, "tuning: launching ", to_string(c.algo), " x",
               c.blocks, "x", c.threads, " failed: ", to_string(launched));
  TPCOMM_CUDA_CHECK(ended);
  TPCOMM_CUDA_CHECK(cudaGraphInstantiate(&g.exec, g.graph, 0));
  // Ranks sharing a GPU: instantiating and uploading may wait for the device to go idle, which
  // a peer's spinning kernel prevents, so every rank uploads before any rank launches.
  TPCOMM_CUDA_CHECK(cudaGraphUpload(g.exec, s));
  TPCOMM_CUDA_CHECK(cudaStreamSynchronize(s));
  boot.barrier();
  TPCOMM_CUDA_CHECK(cudaGraphLaunch(g.exec, s));  // warm-up
  TPCOMM_CUDA_CHECK(cudaStreamSynchronize(s));
  boot.barrier();  // replays of all ranks overlap
  TPCOMM_CUDA_CHECK(cudaEventRecord(start, s));
  for (int i = 0; i < kReplays; ++i) TPCOMM_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
  TPCOMM_CUDA_CHECK(cudaEventRecord(stop, s));
  TPCOMM_CUDA_CHECK(cudaEventSynchronize(stop));
  if (Status h = ar.health(); h != Status::kOk) TPCOMM_THROW(h, "tuning: ", ar.error_message());
  float ms = 0;
  TPCOMM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  // `g` is destroyed on return, before the collective that follows, for the same reason.
  return static_cast<double>(ms) * 1000.0 / (kReplays * kOpsPerGraph);
}

}  // namespace

std::vector<Choice> tune_candidates(std::int64_t bytes, const SelectorCaps& caps) {
  std::vector<Choice> out;
  const int world_size = caps.world_size;
  const int max_blocks = caps.max_blocks;
  const std::int64_t packs = (bytes + 15) / 16;
  for (Algo algo : {Algo::kOneShot, Algo::kTwoShot, Algo::kLamport, Algo::kLamportTwoShot}) {
    if (is_lamport(algo) && !lamport_fits(algo, bytes, world_size, caps.lamport_max_bytes))
      continue;
    const bool sliced = algo == Algo::kTwoShot || algo == Algo::kLamportTwoShot;
    const std::int64_t work = sliced ? (packs + world_size - 1) / world_size : packs;
    for (int threads : {256, 512, 1024}) {
      // Blocks beyond one pack per thread only idle; keep one step past that.
      const std::int64_t useful = std::max<std::int64_t>(1, (work + threads - 1) / threads);
      for (int blocks : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
        if (blocks > max_blocks || blocks > 2 * useful) break;
        out.push_back({algo, blocks, threads});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Choice& a, const Choice& b) { return a.blocks < b.blocks; });
  return out;
}

TuneTable tune_custom_all_reduce(CustomAllReduce& ar, Bootstrap& boot, int device,
                                 const TuneKey& key) {
  DeviceGuard guard(device);
  const SelectorCaps& caps = ar.caps();
  const auto bounds = TuneTable::bucket_bounds(caps.max_bytes);
  const std::int64_t max_count = caps.max_bytes / 2;
  void* in = nullptr;
  void* out = nullptr;
  cudaStream_t s = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  struct Cleanup {
    void** in;
    void** out;
    cudaStream_t* s;
    cudaEvent_t* a;
    cudaEvent_t* b;
    ~Cleanup() {
      if (*in) cudaFree(*in);
      if (*out) cudaFree(*out);
      if (*a) cudaEventDestroy(*a);
      if (*b) cudaEventDestroy(*b);
      if (*s) cudaStreamDestroy(*s);
    }
  } cleanup{&in, &out, &s, &start, &stop};
  TPCOMM_CUDA_CHECK(cudaMalloc(&in, static_cast<std::size_t>(caps.max_bytes)));
  TPCOMM_CUDA_CHECK(cudaMalloc(&out, static_cast<std::size_t>(caps.max_bytes)));
  TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  TPCOMM_CUDA_CHECK(cudaEventCreate(&start));
  TPCOMM_CUDA_CHECK(cudaEventCreate(&stop));
  if (Status w = ar.warm_up(reinterpret_cast<Stream>(s)); w != Status::kOk)
    TPCOMM_THROW(w, "tuning: ", ar.error_message());
  // Never time on zeros.
  TPCOMM_CHECK(kernels::fill_data(in, DType::kBF16, max_count, 2024, boot.rank(), ReduceOp::kSum, 0,
                                  reinterpret_cast<Stream>(s)) == Status::kOk,
               Status::kCudaError, "tuning: filling the input failed");

  std::vector<TuneEntry> entries;
  for (std::int64_t bytes : bounds) {
    const std::int64_t count = bytes / 2;
    const auto iv = TensorView::flat(in, DType::kBF16, count, device);
    const auto ov = TensorView::flat(out, DType::kBF16, count, device);
    const auto candidates = tune_candidates(bytes, caps);
    std::vector<double> times;
    for (const Choice& c : candidates)
      times.push_back(time_candidate(ar, boot, iv, ov, c, s, start, stop));
    // Rank 0's measurements decide for everyone.
    auto shared = boot.broadcast(std::as_bytes(std::span(times)), 0);
    std::memcpy(times.data(), shared.data(),
                std::min(shared.size(), times.size() * sizeof(double)));
    const double best = *std::min_element(times.begin(), times.end());
    std::size_t pick = 0;
    while (times[pick] > best * (1.0 + kTie)) ++pick;
    entries.push_back({bytes, candidates[pick], times[pick]});
    TPCOMM_LOG_INFO("tune ", bytes, " B: ", to_string(candidates[pick].algo), " x",
                    candidates[pick].blocks, " blocks x", candidates[pick].threads, " threads, ",
                    times[pick], " us (", candidates.size(), " candidates)");
  }
  return TuneTable(key, std::move(entries));
}

}  // namespace tpcomm
