// SPDX-License-Identifier: Apache-2.0
// The pure all-reduce selector: a request and the group's capabilities in, an algorithm out.
#pragma once

#include <cstdint>

#include "tpcomm/options.hpp"
#include "tpcomm/types.hpp"
#include "tune/algo.hpp"
#include "tune/table.hpp"

namespace tpcomm {

/// What the custom all-reduce backend of one group can do. Fixed at group setup and identical
/// on every rank: availability is agreed collectively (all ranks vote, DESIGN.md §3).
struct SelectorCaps {
  /// Ranks in the group.
  int world_size = 1;
  /// The custom kernels' buffers and peer mappings exist on every rank of the group.
  bool custom_available = false;
  /// Largest all-reduce the custom kernels serve, in bytes (the staging buffer's size).
  std::int64_t max_bytes = 0;
  /// Most blocks one rank's kernel may launch. Capped, for instance, when several virtual ranks
  /// share one GPU, so that every rank's blocks are resident at once and the barriers between
  /// them cannot deadlock.
  int max_blocks = kMaxBlocksPerRank;
  /// Largest all-reduce the Lamport kernel serves, in bytes (its buffers' slot size); 0 when
  /// the group has no Lamport buffers.
  std::int64_t lamport_max_bytes = 0;
};

/// Block count the vLLM/SGLang kernels never exceed: a grid search on A100-class parts found
/// more blocks only add NVLink contention.
inline constexpr int kDefaultMaxBlocks = 36;
/// Threads per block of the built-in defaults.
inline constexpr int kDefaultThreads = 512;
/// Below this size one-shot is the default for 3 and 4 ranks (vLLM/SGLang switch point).
inline constexpr std::int64_t kOneShotMaxBytesUpTo4Ranks = std::int64_t{512} << 10;
/// Below this size one-shot is the default for 5 to 8 ranks.
inline constexpr std::int64_t kOneShotMaxBytes = std::int64_t{256} << 10;
/// Up to this size the Lamport kernel is the default for f16/bf16 with up to 4 ranks, where
/// the group has Lamport buffers that large (TensorRT-LLM's push one-shot stays ahead of the
/// pull kernels to about here on H100/H200).
inline constexpr std::int64_t kLamportMaxBytesUpTo4Ranks = std::int64_t{256} << 10;
/// Up to this size the Lamport kernel is the default for 5 to 8 ranks.
inline constexpr std::int64_t kLamportMaxBytes = std::int64_t{64} << 10;

/// The default launch shape of `algo` for a message of `bytes` bytes: `kDefaultThreads`
/// threads, and one block per `kDefaultThreads` 16-byte vectors of one rank's work — all
/// ceil(bytes / 16) vectors for one-shot and Lamport, ceil(that / world_size) for the two-shots —
/// clamped to
/// [1, min(max_blocks, kDefaultMaxBlocks)] (a `max_blocks` below 1 counts as 1). `Algo::kNone`
/// gives `Choice{}`.
[[nodiscard]] Choice default_launch(Algo algo, std::int64_t bytes, int world_size,
                                    int max_blocks) noexcept;

/// The built-in choice where no tuned table covers a size, after vLLM's and SGLang's custom
/// all-reduce for fully NVLink-connected GPUs: two ranks always use one-shot; otherwise
/// one-shot below 512 KiB for up to 4 ranks and below 256 KiB for more, two-shot above; the
/// launch shape is `default_launch`'s.
[[nodiscard]] Choice default_choice(std::int64_t bytes, int world_size, int max_blocks) noexcept;

/// Chooses how the custom backend serves an all-reduce of `bytes` bytes of `dtype` with `op`,
/// or `Algo::kNone` when it does not (the caller then hands the request to NCCL).
///
/// In this order:
/// 1. hard requirements, else `kNone`: `caps.custom_available`; 2 <= `caps.world_size` <= 8;
///    `caps.max_blocks` >= 1; `dtype` is f32, f16 or bf16; `op` is sum; 0 < `bytes` <=
///    `caps.max_bytes` and `bytes` is a whole number of elements;
/// 2. `forced` (`TPCOMM_ALGO`): `kNccl` gives `kNone`; the others give that algorithm with
///    `default_launch`'s shape;
/// 3. `kAuto`: the tuned table's choice when `table` is not null, was tuned for
///    `caps.world_size` ranks and covers `bytes` (its choice may be `kNone`: NCCL won that
///    bucket); else Lamport up to `kLamportMaxBytesUpTo4Ranks` (up to 4 ranks) or
///    `kLamportMaxBytes` (more); else `default_choice`;
/// 4. Lamport only where it can serve: `dtype` is f16 or bf16 and `bytes` <=
///    `caps.lamport_max_bytes` (the Lamport two-shot: `lamport_two_shot_slot_bytes(bytes,
///    caps.world_size)` <= `caps.lamport_max_bytes`); where a forced or tuned Lamport cannot,
///    `default_choice`. The built-in choice never picks the Lamport two-shot: the tuner does;
/// 5. in every case `blocks` is clamped to `caps.max_blocks`.
///
/// Rank invariance (DESIGN.md §3): every rank of a group must take the same path for the same
/// call, or the job hangs. This function is pure — the same inputs always give the same output,
/// it reads no global state, clock or environment — and every input is identical on all ranks:
/// the request's size, dtype and op, the group's agreed capabilities, the `TPCOMM_ALGO` knob
/// (the same job-wide) and the table broadcast from rank 0. Nothing local, such as a pointer's
/// alignment or whether a buffer is registered, may become an input: a misaligned pointer means
/// the same algorithm with a staging copy, not another algorithm. Thread-safe; no allocation.
[[nodiscard]] Choice select_all_reduce(std::int64_t bytes, DType dtype, ReduceOp op,
                                       const SelectorCaps& caps, AlgoChoice forced,
                                       const TuneTable* table) noexcept;

}  // namespace tpcomm
