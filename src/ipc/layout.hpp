// SPDX-License-Identifier: Apache-2.0
// Layouts of the peer-visible memory that the all-reduce kernels share, as plain structs.
// Host code and kernels include this header; it has no CUDA syntax.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace tpcomm {

/// Most ranks a custom-kernel group may have (one NVLink node).
inline constexpr int kMaxRanks = 8;
/// Most blocks one rank's all-reduce kernel may launch.
inline constexpr int kMaxBlocks = 64;

// NOTE [signal pad]
// Every rank owns one SignalPad at the start of its workspace; peers write into it through
// their mapping of it. `flags[b][p]` holds the latest barrier value that peer p's block b
// published to this rank; only peer p's block b writes it, so there is one writer per word
// (no torn bytes, no remote atomics). Values only grow: a barrier of operation `seq` in phase
// `ph` publishes `seq * kPhases + ph`, and a waiter proceeds once the word has reached the value
// it expects (wrap-safe comparison, see kernels/common/sync.cuh), so a fast peer that already
// published a later value never blocks a slow one and nothing is ever reset while a peer might
// read it. `seq` is the operation count of this rank's group: every rank runs the same
// operations in the same order, so the counts agree across ranks. It is kept once per block
// index, written only by this rank's own kernels: block b of a launch of G blocks reads
// `seq[b]` when it starts and, when it ends, writes the new count into entries b, b + G,
// b + 2G, ... So after a complete launch every entry holds the same count whatever grid the
// next launch uses, no entry is written while a block of the same launch may still read it,
// and no block waits for another block of its own rank (no atomics on the critical path).
struct alignas(128) SignalPad {
  static constexpr std::uint32_t kPhases = 4;  // 1 start, 2 middle (two-shot), 3 end

  std::uint32_t flags[kMaxBlocks][kMaxRanks];
  std::uint32_t seq[kMaxBlocks];
  /// Written by peer r through its mapping at setup, read back here: proves that the mapping
  /// really carries data before any kernel relies on it.
  std::uint64_t probe[kMaxRanks];
};
static_assert(std::is_trivially_copyable_v<SignalPad>);
static_assert(offsetof(SignalPad, flags) == 0);
static_assert(offsetof(SignalPad, seq) == sizeof(std::uint32_t) * kMaxBlocks * kMaxRanks);
static_assert(sizeof(SignalPad) % 128 == 0);

/// One pointer per rank, as mapped in the reading rank's address space. A null entry means
/// "this rank's input is in its staging buffer" (see NOTE [staging]).
struct RankPtrs {
  const void* ptr[kMaxRanks];
};
static_assert(std::is_trivially_copyable_v<RankPtrs>);
static_assert(sizeof(RankPtrs) == kMaxRanks * sizeof(void*));

// NOTE [staging]
// A rank's input reaches its peers in one of two ways. Registered: the kernel reads the
// user's buffer directly through a pointer exchanged after graph capture. Staged: the kernel
// first copies its input into its own staging buffer, and peers read that. Staging is double
// buffered by the parity of the operation count: before writing half `seq % 2` a rank has passed
// the start barrier of operation seq - 1, so every peer has finished operation seq - 2, the last
// one that read that half. Eager calls always stage; captured calls in the registered size range
// stage only a rank whose own buffer cannot be read in place (misaligned, or in-place, where the
// output would overwrite what peers read). Either way every rank runs the same barriers.

/// Byte offsets of the parts of one rank's workspace (the same on every rank).
struct WorkspaceLayout {
  std::int64_t signal = 0;      // SignalPad
  std::int64_t staging = 0;     // two halves of `half_bytes`
  std::int64_t scratch = 0;     // two-shot's reduced slices, `half_bytes`
  std::int64_t half_bytes = 0;  // capacity of one staging half, in bytes
  std::int64_t total = 0;

  /// The layout for messages of up to `max_bytes` bytes.
  static constexpr WorkspaceLayout make(std::int64_t max_bytes) {
    constexpr std::int64_t kAlign = 256;
    WorkspaceLayout l;
    l.half_bytes = (max_bytes + kAlign - 1) / kAlign * kAlign;
    l.signal = 0;
    l.staging = (static_cast<std::int64_t>(sizeof(SignalPad)) + kAlign - 1) / kAlign * kAlign;
    l.scratch = l.staging + 2 * l.half_bytes;
    l.total = l.scratch + l.half_bytes;
    return l;
  }
};
static_assert(WorkspaceLayout::make(100).half_bytes == 256);
static_assert(WorkspaceLayout::make(8 << 20).scratch % 256 == 0);

/// Where a kernel reports that it gave up waiting. Lives in host-mapped memory: the host reads
/// it without synchronising. `code` is 0 while healthy; the first block to fail writes it.
struct ErrorWord {
  static constexpr std::uint32_t kTimeout = 1;
  static constexpr std::uint32_t kAborted = 2;

  std::uint32_t code;
  std::uint32_t rank;   // the rank that reported
  std::uint32_t peer;   // the peer it was waiting for
  std::uint32_t block;  // the block that was waiting
};
static_assert(sizeof(ErrorWord) == 16);

}  // namespace tpcomm
