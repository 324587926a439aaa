// SPDX-License-Identifier: Apache-2.0
// The pure all-reduce selector: a request and the group's capabilities in, an algorithm out.
#pragma once

#include <array>
#include <cstdint>

#include "tpcomm/options.hpp"
#include "tpcomm/types.hpp"
#include "tune/algorithms.hpp"
#include "tune/table.hpp"

namespace tpcomm {

/// What the custom all-reduce backend of one group can do. Fixed at group setup and identical
/// on every rank: availability is agreed collectively (all ranks vote, docs/DESIGN.md §3).
/// Most blocks in clusters of 2, 4 and 8 blocks (index: `cluster_index`).
using ClusterBlocks = std::array<int, 3>;

/// The index in a `ClusterBlocks` of clusters of `size` (2, 4 or 8) blocks.
constexpr std::size_t cluster_index(int size) noexcept { return size <= 2 ? 0 : size <= 4 ? 1 : 2; }

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
  int max_blocks = kMaxBlocks;
  /// Largest all-reduce the Lamport kernel serves, in bytes (its buffers' slot size); 0 when
  /// the group has no Lamport buffers.
  std::int64_t lamport_max_bytes = 0;
  /// Largest input, in bytes, that one rank's exchange stages (all-gather, all-to-all, the
  /// LM-head exchange): the larger of the all-reduce's staging half and the exchange buffer
  /// `Group::prepare_exchange` adds.
  std::int64_t exchange_max_bytes = 0;
  /// Most blocks one rank's fused kernel may launch in clusters of 2, 4 and 8 blocks (NOTE [row
  /// groups] in kernels/common/epilogue.cuh), as `max_blocks` caps them alone: a GPC holds a
  /// whole number of clusters, so fewer blocks fit in clusters than alone.
  ClusterBlocks max_cluster_blocks{kMaxBlocks, kMaxBlocks, kMaxBlocks};
  /// A deterministic group (`Options::deterministic` not off): the custom kernels serve every
  /// all-reduce and fused norm they can hold, whatever the bounds set for speed say, and the
  /// fused kernels' launch shape depends on the hidden size alone (NOTE [batch invariance]).
  bool deterministic = false;
};

// NOTE [batch invariance]
// Every custom all-reduce sums an element over the ranks in rank order in fp32 and rounds once
// (`sum_packs`, kernels/common/workspace.cuh), whatever the algorithm, the launch shape or the
// element's place in the message, so a token's sums are bitwise the same in any batch. The fused
// norm's sum of squares is not, by itself: each thread adds the terms of the packs it holds,
// then the block and the group of blocks (NOTE [row groups]) combine them, so its order depends
// on the threads per block and the group's size, which `fused_launch` picks from the rows as
// well as the hidden size. A deterministic group launches the fused kernels without groups
// (one block a row, threads from the hidden size alone: the shape of the local `add_rmsnorm`
// kernel of the unfused pair, which adds and rounds as the fused kernels do), and lets no bound
// that exists only for speed hand a call the custom kernels can hold to NCCL, whose order of
// summation is its own, or to the unfused pair, whose all-reduce NCCL may then serve.

/// Blocks the built-in launch shapes never exceed (a default, not a limit: the tuner may pick
/// more): the vLLM/SGLang kernels' grid search on A100-class parts found that more blocks only
/// add NVLink contention.
inline constexpr int kDefaultMaxBlocks = 36;
/// Threads per block of the built-in launch shapes.
inline constexpr int kDefaultThreads = 512;

// NOTE [lamport launch]
// The Lamport one-shot kernel's block pushes R packs and refills R packs for each of its threads
// before it polls, and its frame (the operation count, one block barrier) is paid once a block:
// one block of 512 threads doing all of a small message spent most of its time in one SM's
// stores at 4 and 8 ranks, and in the barriers of 16 warps at 2 (phase clocks in
// docs/PERFORMANCE.md). So it takes one vector a thread in blocks of `kLamportThreads` up to
// `kLamportSmallBlocks` blocks (16 KiB), then `kLamportWideBlocks` blocks of as many threads as
// that takes (a multiple of 32), and past 512 threads the shape of the other kernels. Measured
// on virtual ranks against the 512-thread shape: 0.2-0.7 µs faster at 1-64 KiB on 2 and 4
// ranks, 1.3 µs at 16 KiB on 8.
inline constexpr int kLamportThreads = 128;
inline constexpr std::int64_t kLamportSmallBlocks = 8;
inline constexpr std::int64_t kLamportWideBlocks = 16;

/// The default launch shape of `algo` for a message of `bytes` bytes: `kDefaultThreads`
/// threads, and one block per `kDefaultThreads` 16-byte vectors of one rank's work — all
/// ceil(bytes / 16) vectors, or ceil(that / world_size) for the kernels that work on slices —
/// clamped to [1, min(max_blocks, kDefaultMaxBlocks)] (a `max_blocks` below 1 counts as 1); the
/// Lamport one-shot kernel's shape is NOTE [lamport launch]'s, within the same clamp.
/// `Algo::kNone` gives `Choice{}`.
[[nodiscard]] Choice default_launch(Algo algo, std::int64_t bytes, int world_size,
                                    int max_blocks) noexcept;

/// The built-in choice where no tuned table covers a size (`BuiltIn` in tune/algorithms.hpp):
/// among the algorithms that can serve `bytes` bytes of `dtype` in a group with `caps`, and only
/// those that read peers' inputs unless `allow_push`, the lowest `BuiltIn::order` whose bound
/// for `caps.world_size` holds `bytes` (in a deterministic group, past every bound, the one with
/// the largest bound); with `default_launch`'s shape.
[[nodiscard]] Choice built_in_choice(std::int64_t bytes, DType dtype, const SelectorCaps& caps,
                                     bool allow_push) noexcept;

/// `built_in_choice` among the algorithms that read peers' inputs (any dtype), for a group of
/// `world_size` ranks whose kernels launch at most `max_blocks` blocks: with the registry's
/// bounds, one-shot for 2 ranks, and below 512 KiB for up to 4 ranks and 256 KiB for more;
/// two-shot above.
[[nodiscard]] Choice default_choice(std::int64_t bytes, int world_size, int max_blocks) noexcept;

/// Chooses how the custom backend serves an all-reduce of `bytes` bytes of `dtype` with `op`,
/// or `Algo::kNone` when it does not (the caller then hands the request to NCCL).
///
/// In this order:
/// 1. hard requirements, else `kNone`: `caps.custom_available`; 2 <= `caps.world_size` <= 8;
///    `caps.max_blocks` >= 1; `dtype` is f32, f16 or bf16; `op` is sum; 0 < `bytes` <=
///    `caps.max_bytes` and `bytes` is a whole number of elements;
/// 2. `pinned` (`TPCOMM_ALGO`): `Algo::kNone` ("nccl") gives `kNone`; an algorithm gives that
///    algorithm with `default_launch`'s shape;
/// 3. automatic (`pinned` is nullopt): the tuned table's choice when `table` is not null, was
///    tuned for `caps.world_size` ranks and covers `bytes` (its choice may be `kNone`: NCCL won
///    that bucket, except in a deterministic group, where `built_in_choice` decides instead);
///    else `built_in_choice`;
/// 4. a pinned or tuned algorithm that does not `fit` (a Lamport kernel for f32, or beyond its
///    buffers) gives `built_in_choice` among the algorithms that read peers' inputs;
/// 5. in every case `blocks` is clamped to `caps.max_blocks`.
///
/// Rank invariance (docs/DESIGN.md §3): every rank of a group must take the same path for the same
/// call, or the job hangs. This function is pure — the same inputs always give the same output,
/// it reads no global state, clock or environment — and every input is identical on all ranks:
/// the request's size, dtype and op, the group's agreed capabilities, the `TPCOMM_ALGO` knob
/// (the same job-wide) and the table broadcast from rank 0. Nothing local, such as a pointer's
/// alignment or whether a buffer is registered, may become an input: a misaligned pointer means
/// the same algorithm with a staging copy, not another algorithm. Thread-safe; no allocation.
[[nodiscard]] Choice select_all_reduce(std::int64_t bytes, DType dtype, ReduceOp op,
                                       const SelectorCaps& caps, Pinned pinned,
                                       const TuneTable* table) noexcept;

/// The launch shape of the fused all-reduce + add + RMSNorm on `algo` (a kernel that `fuses`)
/// for `rows` rows of `hidden` 16-bit elements: a group of up to `kernels::kMaxRowGroup` blocks
/// per row while the rows leave blocks to spare (NOTE [row groups] in
/// kernels/common/epilogue.cuh), each holding at most 256 packs of it, with about one 16-byte
/// pack of a row per thread (64 to `kernels::kFusedMaxThreads` threads); at most `max_blocks`
/// blocks (blocks then take several rows), and a group only where its clusters fit
/// (`cluster_blocks`, as `SelectorCaps::max_cluster_blocks`). On the Lamport one-shot kernel the
/// rows take at least as many blocks as `default_launch` gives its plain all-reduce of the same
/// bytes, up to `kLamportWideBlocks` and rounded up to whole groups where those clusters fit, the
/// blocks past the rows only pushing and refilling.
[[nodiscard]] Choice fused_launch(Algo algo, std::int64_t rows, std::int64_t hidden, int max_blocks,
                                  const ClusterBlocks& cluster_blocks = {kMaxBlocks, kMaxBlocks,
                                                                         kMaxBlocks}) noexcept;

/// Chooses how the custom backend serves the fused all-reduce + residual add + RMSNorm of `rows`
/// rows of `hidden` elements of `dtype`, or `Algo::kNone` (the caller then runs the group's
/// all-reduce and the local `add_rmsnorm`). Like `select_all_reduce`, pure and fed only
/// rank-invariant inputs. In this order:
/// 1. hard requirements, else `kNone`: the custom backend with Lamport buffers; 2 <= world size
///    <= 8; `dtype` f16 or bf16; rows and hidden >= 1;
/// 2. `pinned`: "nccl" gives `kNone`; an algorithm that `fuses` gives that algorithm where it
///    fits (others are ignored here: they cannot fuse);
/// 3. automatic: the tuned table's fused bucket for the input's bytes, where the table was
///    tuned for this world size, has fused buckets and names an algorithm that fits (`none`
///    there: the fallback won, `kNone`);
/// 4. the built-in choice: among the algorithms that fit, the lowest `AlgoInfo::fused` order
///    whose bound holds the bytes (none past every bound: `kNone`);
/// always with `fused_launch`'s shape. A deterministic group (NOTE [batch invariance]) skips a
/// tuned `none`, takes the lowest order that fits past every bound, and launches without
/// groups of blocks. `*why`, when given, receives why it gives `kNone` (a
/// static string), or nullptr when it gives an algorithm.
[[nodiscard]] Choice select_add_rmsnorm(std::int64_t rows, std::int64_t hidden, DType dtype,
                                        const SelectorCaps& caps, Pinned pinned,
                                        const TuneTable* table,
                                        const char** why = nullptr) noexcept;

/// The same for the reduce-scatter form (`reduce_scatter_add_rmsnorm`: each rank finishes its
/// own `rows / world size` rows; NOTE [scattered rows] in kernels/all_reduce_lamport_two_shot.cuh):
/// only the kernels that `scatters` serve it, and only where each rank's rows start on a 16-byte
/// boundary of the message; a pinned algorithm that fuses but cannot scatter gives `kNone`; the
/// tuned table's fused buckets (measured for the all-reduce form) are not read; the built-in
/// bounds are the all-reduce form's, by the bytes of the whole input; `fused_launch` shapes the
/// rows a rank finishes.
[[nodiscard]] Choice select_reduce_scatter_add_rmsnorm(std::int64_t rows, std::int64_t hidden,
                                                       DType dtype, const SelectorCaps& caps,
                                                       Pinned pinned,
                                                       const char** why = nullptr) noexcept;

/// The sizes of an exchange that its choice depends on, the same on every rank (an
/// `ExchangePlan`'s): the largest rank's input, the most bytes a rank receives, the most bytes a
/// rank sends another, and the Lamport slot the push form needs (0: it cannot push).
struct ExchangeSize {
  std::int64_t largest_input = 0;
  std::int64_t largest_output = 0;
  std::int64_t largest_region = 0;
  std::int64_t push_slot_bytes = 0;
};

/// Chooses how the custom backend serves an exchange (all-gather, all-to-all, the LM-head
/// exchange) of `size`, or `ExchangeAlgo::kNone` (NCCL then serves it). Pure and fed only
/// rank-invariant inputs, like `select_all_reduce`:
/// 1. hard requirements, else `kNone`: `caps.custom_available`; 2 <= world size <= 8;
///    `caps.max_blocks` >= 1; 0 < `largest_input` <= `caps.exchange_max_bytes` and below 4 GiB;
/// 2. `pinned` "nccl" gives `kNone` (an all-reduce algorithm pins nothing here);
/// 3. `pinned_exchange` where it `fits`, with `exchange_launch`'s shape;
/// 4. unpinned, the tuned table's exchange bucket for `largest_output` (the work of the busiest
///    rank), where `table` is not null, was tuned for this world size, has exchange buckets that
///    cover it and its algorithm fits (`none` there: NCCL);
/// 5. the lowest `ExchangeInfo::built_in` order that fits and whose bound holds `largest_region`,
///    with `exchange_launch`'s shape;
/// `blocks` always clamped to [1, min(caps.max_blocks, the algorithm's max_blocks)].
[[nodiscard]] ExchangeChoice select_exchange(const ExchangeSize& size, const SelectorCaps& caps,
                                             Pinned pinned, PinnedExchange pinned_exchange,
                                             const TuneTable* table) noexcept;

// NOTE [exchange launch]
// The push form's kernel pushes and polls each of its lines from one thread, so a small
// exchange in a few blocks of 512 threads left its stores and polls to a few SMs, as the Lamport
// all-reduce's did (NOTE [lamport launch]). It takes blocks of `kExchangeSmallThreads` threads,
// one per `kExchangeSmallBytes` received, or per twice or four times that, the first that keeps
// them within `kExchangeSmallBlocks` (and the group's limit); past that, blocks of
// `kDefaultThreads`, one per 4 KiB received: a line a thread, as many as the group's limit
// allows. Measured on virtual ranks against 512-thread blocks one per 16 KiB: 0.1-2.5 µs faster
// from 1 to 64 KiB at 2, 4 and 8 ranks, and the LM head's exchange at one token (252 KiB
// received) 1.1-1.5 µs faster at 2 and 4 ranks (docs/PERFORMANCE.md).
inline constexpr int kExchangeSmallThreads = 128;
inline constexpr std::int64_t kExchangeSmallBytes = 1024;
inline constexpr std::int64_t kExchangeSmallBytesMost = 4096;
inline constexpr std::int64_t kExchangeSmallBlocks = 32;

/// The built-in launch shape of `algo` for an exchange in which no rank receives more than
/// `largest_output` bytes: in the push form, NOTE [exchange launch]'s small blocks where they
/// fit; else `kDefaultThreads` threads, one block per 32 KiB received (4 KiB, a line a thread,
/// in the push form); within [1, min(caps.max_blocks, the algorithm's max_blocks)].
[[nodiscard]] ExchangeChoice exchange_launch(ExchangeAlgo algo, std::int64_t largest_output,
                                             const SelectorCaps& caps) noexcept;

}  // namespace tpcomm
