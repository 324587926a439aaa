// SPDX-License-Identifier: Apache-2.0
// The exchange (pull): after one barrier every rank copies what it receives straight out of each
// peer's buffer into its own output. All-gather, all-to-all and the LM-head exchange are this one
// kernel with different copy regions.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.hpp"
#include "kernels/common/copy.cuh"
#include "kernels/common/dispatch.cuh"
#include "kernels/common/sync.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

// NOTE [exchange]
// Each rank describes, per source rank, the rows it takes from that source's input and where
// they land in its own output (`CopyRegion`): an all-gather takes all of every input, an
// all-to-all one chunk of each, the LM-head exchange this rank's rows of every vocabulary shard,
// written at that shard's column offset of the output, so the reassembly that SGLang does with a
// separate permute and copy happens in the addressing of the one copy. The regions are computed
// on every rank from the same shapes (src/ops/exchange.hpp), so every rank runs the same
// barriers whatever it reads.
//
// A rank's input reaches its peers as in the barrier all-reduce (NOTE [staging] in
// ipc/layout.hpp): registered inside a capture scope, else staged. Peers read any part of a
// staged input, not only what the same block of this rank copied, so the staging copy is a kernel
// of its own that completes before the exchange kernel starts (the exchange kernel's
// `begin_launch` waits for it); the half it writes is chosen by the same operation count, read
// from the signal pad on the device (a graph replays host-side counts wrongly).
//
// Accesses are `V` bytes wide, the widest that every region's offsets, pitches and row bytes,
// and the output pointer, allow (16 for the usual shapes). Each source's region is a flat range
// of accesses (row-major). The sources' ranges, starting with this rank's own and going round (so
// that ranks do not all read from one peer at once), make one list split over every thread of the
// grid (`copy_regions`): at small sizes a thread has an access or two, whichever sources they come
// from, and loads them in one round trip to memory (a source at a time took one a source).

namespace {

__device__ __forceinline__ char* staging_half(const ExchangeParams& p, int rank,
                                              std::uint32_t seq) {
  return p.staging[rank] + static_cast<std::int64_t>(seq & 1u) * p.half_bytes;
}

/// Copies this rank's input into its staging half of the coming operation (NOTE [exchange]).
template <int V>
__global__ void __launch_bounds__(1024) exchange_stage_kernel(ExchangeParams p) {
  begin_launch();
  if (p.world_size == 0) return;  // a warm-up launch (NOTE [first launch])
  // The coming operation's number: every entry holds the last count after a complete launch.
  const std::uint32_t seq = p.pads[p.rank]->seq[0] + 1u;
  CopyRegion all{0, 0, 0, 0, 1, p.input_bytes / V * V};
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  char* dst = staging_half(p, p.rank, seq);
  const char* in = static_cast<const char*>(p.input);
  copy_region<V>(in, dst, all, first, stride);
  if (first == 0)
    for (std::int64_t b = all.row_bytes; b < p.input_bytes; ++b) dst[b] = in[b];
}

template <int R, int V>
__global__ void __launch_bounds__(1024, 1) exchange_kernel(ExchangeParams p) {
  begin_launch();
  if (p.world_size == 0) return;  // a warm-up launch (NOTE [first launch])
  __shared__ std::uint32_t seq_shared, failed_shared;
  const WaitContext wait = wait_context(p);
  if (threadIdx.x == 0) {
    SignalPad* self = p.pads[p.rank];
    const OperationStart start = start_operation(self, self->seq, p.fingerprint, p.call);
    seq_shared = start.seq;
    failed_shared = start.failed;
  }
  __syncthreads();
  const std::uint32_t seq = seq_shared;
  // Every rank's input as mapped here, worked out while the barrier waits (the barrier's
  // `__syncthreads` publishes them); R pointers held in registers made the kernel spill at 7 and 8
  // ranks (+0.6 us at 8).
  __shared__ const char* inputs[R];
  if (threadIdx.x < R) {
    const int s = static_cast<int>(threadIdx.x);
    const void* registered = p.registered != nullptr ? p.registered->ptr[s] : nullptr;
    inputs[s] =
        registered != nullptr ? static_cast<const char*>(registered) : staging_half(p, s, seq);
  }
  // False from where the block gave up (NOTE [bounded waits]); the same in every thread, and
  // one place that poisons the outputs at the end (each would be inlined).
  bool ok = failed_shared == 0;
  // Pattern 2 of NOTE [memory ordering]: every peer's input (staged by a kernel that completed
  // before its exchange kernel began, or registered) is complete once its flag arrives.
  ok = ok && barrier_block<R>(p.pads, p.rank, seq * SignalPad::kPhases + 1, p.fingerprint, wait);

  if (ok) {
    if (!p.end_barrier && p.early_launch) allow_next_launch();
    const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
    auto source = [&](int k) { return p.rank + k < R ? p.rank + k : p.rank + k - R; };
    copy_regions<R, V>([&](int k) { return inputs[source(k)]; },
                       [&](int k) { return p.from[source(k)]; }, static_cast<char*>(p.output),
                       first, stride);
  }

  // Registered inputs belong to their callers again when the kernel ends.
  if (ok && p.end_barrier) {
    ok = barrier_block<R>(p.pads, p.rank, seq * SignalPad::kPhases + 3, p.fingerprint, wait);
    if (ok && p.early_launch) allow_next_launch();
  }
  if (!ok) return poison_exchange<R, V>(p);
  end_launch(p.pads[p.rank]->seq, seq);
}

/// The local copy of `RegionCopyParams`: no peer, no barrier.
template <int V>
__global__ void __launch_bounds__(1024) region_copy_kernel(RegionCopyParams p) {
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  copy_regions<kMaxRanks, V>([&](int k) { return p.sources[k]; },
                             [&](int k) { return k < p.regions ? p.from[k] : CopyRegion{}; },
                             static_cast<char*>(p.output), first, stride);
}

const void* exchange_function(int world_size, int access) noexcept {
  const void* out = nullptr;
  (void)dispatch_world_size(world_size, [&]<int R>() {
    out = dispatch_access(
        access, [&]<int V>() { return reinterpret_cast<const void*>(&exchange_kernel<R, V>); });
    return Status::kOk;
  });
  return out;
}

const void* stage_function(int access) noexcept {
  return dispatch_access(
      access, [&]<int V>() { return reinterpret_cast<const void*>(&exchange_stage_kernel<V>); });
}

}  // namespace

Status launch_exchange(const ExchangeParams& params, LaunchShape shape, bool stage,
                       bool programmatic, Stream stream) noexcept {
  const int world = params.world_size;
  if (world < 2 || world > kMaxRanks || params.rank < 0 || params.rank >= world ||
      shape.blocks < 1 || shape.blocks > kMaxBlocks || shape.threads < 32 || shape.threads > 1024 ||
      shape.threads % 32 != 0 || shape.threads < world)
    return Status::kInvalidArgument;
  // Staged and registered inputs are 16-byte aligned (registration requires it).
  const int access = access_for(params.from, world, params.output, nullptr);
  if (access == 0) return Status::kInvalidArgument;
  if (stage) {
    if (params.input_bytes > params.half_bytes) return Status::kInvalidArgument;
    const int in_access = widest_access({address(params.input)});
    if (params.input_bytes / in_access >= (std::int64_t{1} << 32)) return Status::kInvalidArgument;
    TPCOMM_TRY(launch_with(stage_function(in_access), params, shape, programmatic, stream));
  }
  return launch_with(exchange_function(world, access), params, shape, programmatic, stream);
}

Status launch_region_copy(const RegionCopyParams& params, Stream stream) noexcept {
  if (params.regions < 0 || params.regions > kMaxRanks) return Status::kInvalidArgument;
  const int access = access_for(params.from, params.regions, params.output, params.sources);
  if (access == 0) return Status::kInvalidArgument;
  std::int64_t total = 0;  // accesses: the regions are one list (`copy_regions`)
  for (int r = 0; r < params.regions; ++r)
    total += params.from[r].rows * (params.from[r].row_bytes / access);
  constexpr int kThreads = 512;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>((total + 4 * kThreads - 1) / (4 * kThreads), 1, 1024));
  RegionCopyParams copy = params;
  void* args[] = {&copy};
  const void* function = dispatch_access(
      access, [&]<int V>() { return reinterpret_cast<const void*>(&region_copy_kernel<V>); });
  return cudaLaunchKernel(function, dim3(blocks), dim3(kThreads), args, 0,
                          reinterpret_cast<cudaStream_t>(stream)) == cudaSuccess
             ? Status::kOk
             : Status::kCudaError;
}

Status warm_up_exchange(int world_size, Stream stream) noexcept {
  ExchangeParams empty{};  // world size 0: the kernels return at once
  for (int access : {16, 8, 4, 2, 1}) {
    const void* exchange = exchange_function(world_size, access);
    if (exchange == nullptr) return Status::kInvalidArgument;
    TPCOMM_TRY(launch_with(exchange, empty, {1, 32}, false, stream));
    TPCOMM_TRY(launch_with(stage_function(access), empty, {1, 32}, false, stream));
  }
  // The region copy takes its access width from the output's alignment among others: an
  // address of that alignment, never dereferenced (no region has rows), picks each width.
  RegionCopyParams none{};
  for (std::uintptr_t width : {16u, 8u, 4u, 2u, 1u}) {
    none.output = reinterpret_cast<void*>(width);
    TPCOMM_TRY(launch_region_copy(none, stream));
  }
  return warm_up_exchange_push(world_size, stream);
}

int exchange_max_blocks_per_sm(int world_size, int threads) noexcept {
  int most = 0;
  for (int access : {16, 8, 4, 2, 1}) {
    const void* function = exchange_function(world_size, access);
    int blocks = 0;
    if (function == nullptr ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, threads, 0) != cudaSuccess)
      return 0;
    most = most == 0 ? blocks : std::min(most, blocks);
  }
  const int push = exchange_push_max_blocks_per_sm(world_size, threads);
  return push == 0 ? 0 : std::min(most, push);
}

}  // namespace tpcomm::kernels
