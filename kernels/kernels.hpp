// SPDX-License-Identifier: Apache-2.0
// Host-visible declarations of every kernel launcher. No CUDA syntax: host code includes this.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ipc/layout.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::kernels {

/// The all-reduce kernels, one file each (`kernels/all_reduce_<kernel>.cu` and its `.cuh`). Which
/// algorithm runs which kernel, where it fits and how it is tuned is the registry's business
/// (src/tune/algorithms.hpp); this layer knows only what each kernel needs.
enum class KernelId : std::uint8_t { kOneShot, kTwoShot, kLamport, kLamportTwoShot };

/// True for the kernels that push into the Lamport receive buffers (NOTE [lamport] in
/// ipc/layout.hpp) instead of reading peers' inputs between barriers; 16-bit types only.
constexpr bool pushes(KernelId k) noexcept {
  return k == KernelId::kLamport || k == KernelId::kLamportTwoShot;
}

/// True for the kernels in which each rank reduces one slice of 1 / world size of the message.
constexpr bool sliced(KernelId k) noexcept {
  return k == KernelId::kTwoShot || k == KernelId::kLamportTwoShot;
}

/// Bytes of every Lamport slot that kernel `k` needs for a message of `bytes` bytes among
/// `world_size` ranks; 0 for the kernels that do not push.
constexpr std::int64_t lamport_slot_need(KernelId k, std::int64_t bytes, int world_size) noexcept {
  if (k == KernelId::kLamport) return bytes;
  if (k == KernelId::kLamportTwoShot) return lamport_two_shot_slot_bytes(bytes, world_size);
  return 0;
}

/// Blocks per rank's kernel and threads per block.
struct LaunchShape {
  int blocks = 0;
  int threads = 0;
};

/// Everything one rank's all-reduce kernel needs; passed by value.
struct AllReduceParams {
  /// Every rank's input as mapped here, in device memory filled when a capture scope closes
  /// (NOTE [staging]); a null entry reads that rank's staging half. Null when every rank's
  /// input is staged (eager calls, small captured calls).
  const RankPtrs* registered;
  /// This rank's own input, copied into its staging half when its entry is null.
  const void* input;
  /// This rank's output; any alignment.
  void* output;
  /// Every rank's workspace base (a `WorkspaceLayout`) as mapped here.
  char* workspaces[kMaxRanks];
  /// Every rank's signal pad (`workspaces[r] + layout.signal`). Kernels index it by thread, and
  /// an array indexed at run time must stay in parameter space: a copy in the kernel would
  /// live in local memory, on the critical path of every barrier.
  SignalPad* pads[kMaxRanks];
  WorkspaceLayout layout;
  /// Elements to reduce.
  std::int64_t count;
  DType dtype;
  int rank;
  int world_size;
  /// Run the end barrier (registered inputs must stay untouched until every peer has read).
  bool end_barrier;
  /// Give up waiting for a peer after this many nanoseconds (0 = never).
  std::uint64_t timeout_ns;
  /// Host-mapped error report and abort flag (NOTE [bounded waits], kernels/common/sync.cuh).
  ErrorWord* error;
  const std::uint32_t* abort_flag;
};
static_assert(std::is_trivially_copyable_v<AllReduceParams>);

/// The kernel function of `kernel` for `dtype` and `world_size` ranks, with the identity
/// epilogue (NOTE [epilogues] in kernels/common/epilogue.cuh); nullptr where it has none (an
/// unsupported dtype or world size, f32 for the kernels that push).
const void* kernel_function(KernelId kernel, DType dtype, int world_size) noexcept;

/// Launches `kernel` on `stream` with `shape`; with `programmatic`, as a programmatic dependent
/// launch (NOTE [programmatic launch] in kernels/common/sync.cuh). `params.count` 0 launches it
/// with nothing to do (NOTE [first launch] in backends/custom_ar.cpp). kInvalidArgument for an
/// unsupported dtype/world size/launch shape, or a message the Lamport slots cannot hold;
/// kCudaError when the launch fails. Sum only; world sizes 2..8.
Status launch_all_reduce(const AllReduceParams& params, KernelId kernel, LaunchShape shape,
                         bool programmatic, Stream stream) noexcept;

/// Fills `bytes` bytes (a multiple of 16, 16-byte aligned) of Lamport buffers with the empty
/// mark (NOTE [lamport] in ipc/layout.hpp).
Status fill_lamport_empty(void* buffers, std::int64_t bytes, Stream stream) noexcept;

/// Most blocks of `threads` threads of `kernel` that one SM can hold at once (occupancy); 0 where
/// the kernel has no instantiation for `dtype` and `world_size`.
int max_blocks_per_sm(KernelId kernel, DType dtype, int world_size, int threads) noexcept;

// ---- exact test data (tests and `tpcomm bench --check`) ----------------------------------

/// What the checked collective was, for `check_data`.
enum class Collective : std::uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast
};

/// Fills `count` elements with rank `rank`'s exact test values for `op` (small integers whose
/// every partial result is representable in `dtype`), starting at element index `first`.
Status fill_data(void* data, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                 ReduceOp op, std::int64_t first, Stream stream) noexcept;

/// Launches the test-data kernels once on `stream` with nothing to do (NOTE [first launch]).
Status warm_up_test_data(Stream stream) noexcept;

/// Sets every byte of `bytes` bytes to 0xFF (NaN in every float type) so that an element the
/// collective did not write cannot pass a check.
Status poison(void* data, std::int64_t bytes, Stream stream) noexcept;

/// Counts the elements of `out` that differ bitwise from what `collective` must produce on
/// rank `rank` of `world_size` from `fill_data` inputs (`count` = elements of `out`; `root` for
/// broadcast), adding the count to `*wrong` (device memory).
Status check_data(const void* out, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                  int world_size, ReduceOp op, Collective collective, int root,
                  unsigned long long* wrong, Stream stream) noexcept;

}  // namespace tpcomm::kernels
