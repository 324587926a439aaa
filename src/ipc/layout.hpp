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

/// Receive buffers of the Lamport all-reduce (NOTE [lamport]).
inline constexpr int kLamportBuffers = 3;
/// The "not yet written" value of every 16-bit element of a Lamport buffer.
inline constexpr std::uint16_t kLamportEmpty = 0x8000;

// NOTE [signal pad]
// Every rank owns one SignalPad at the start of its workspace; peers write into it through
// their mapping of it. `flags[b][p]` holds the latest barrier value that peer p's block b
// published to this rank (its low 32 bits; the high 32 bits carry a hash of that operation's
// fingerprint, NOTE [fingerprints] in kernels/common/sync.cuh); only peer p's block b writes it,
// so there is one writer per word (no torn bytes, no remote atomics). Values only grow: a barrier
// of operation `seq` in phase `ph` publishes `seq * kPhases + ph`, and a waiter proceeds once the
// word has reached the value it expects (wrap-safe comparison, see kernels/common/sync.cuh), so a
// fast peer that already published a later value never blocks a slow one and nothing is ever reset
// while a peer might read it. `seq` is the operation count of this rank's group: every rank runs
// the same operations in the same order, so the counts agree across ranks. It is kept once per
// block index, written only by this rank's own kernels: block b of a launch of G blocks reads
// `seq[b]` when it starts and, when it ends, writes the new count into entries b, b + G,
// b + 2G, ... So after a complete launch every entry holds the same count whatever grid the
// next launch uses, no entry is written while a block of the same launch may still read it,
// and no block waits for another block of its own rank (no atomics on the critical path).
struct alignas(128) SignalPad {
  static constexpr std::uint32_t kPhases = 4;  // 1 start, 2 middle (two-shot), 3 end

  std::uint64_t flags[kMaxBlocks][kMaxRanks];
  std::uint32_t seq[kMaxBlocks];
  /// The count of Lamport operations, kept like `seq` (NOTE [lamport]).
  std::uint32_t lamport_seq[kMaxBlocks];
  /// Bytes per rank slot that the last Lamport operation using buffer b left in it.
  std::uint32_t lamport_dirty[kLamportBuffers];
  /// The Lamport operation each block of this rank's Lamport kernels last started, written when
  /// a block begins. A peer that gives up waiting reads it to tell a rank that never started the
  /// operation from one that is stuck inside it (NOTE [bounded waits]). The barrier kernels need
  /// no such word: the flag a waiter polls already says which operation the peer last reached.
  std::uint32_t lamport_started[kMaxBlocks];
  /// Written by peer r through its mapping at setup, read back here: proves that the mapping
  /// really carries data before any kernel relies on it.
  std::uint64_t probe[kMaxRanks];
  /// `lamport_fingerprint[j][p]`: the 32-bit header (a hash of the call's fingerprint) that peer p
  /// pushes with its data into Lamport buffer j, emptied and refilled like the buffer's slots
  /// (NOTE [lamport]).
  alignas(16) std::uint32_t lamport_fingerprint[kLamportBuffers][kMaxRanks];
  /// What this rank's kernels last started before it failed: the fingerprint and the group's call
  /// number, read by the hosts after a wait gave up (NOTE [fingerprints]).
  std::uint64_t posted_fingerprint;
  std::uint32_t posted_call;
  /// Non-zero once a kernel of this rank gave up (the ErrorWord code): every later kernel of the
  /// rank gives up at its start and poisons its outputs (NOTE [poisoned outputs]).
  std::uint32_t failed;
};
static_assert(std::is_trivially_copyable_v<SignalPad>);
static_assert(offsetof(SignalPad, flags) == 0);
static_assert(offsetof(SignalPad, seq) == sizeof(std::uint64_t) * kMaxBlocks * kMaxRanks);
static_assert(sizeof(SignalPad) % 128 == 0);
static_assert(offsetof(SignalPad, lamport_fingerprint) % 16 == 0);
static_assert(sizeof(SignalPad::lamport_fingerprint) % 16 == 0);

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

// NOTE [lamport]
// The Lamport all-reduce needs no barrier: the data is the flag. Every rank owns three
// receive buffers, each with one slot per rank, filled with the 16-bit pattern 0x8000 (-0.0 in
// f16 and bf16), which no slot ever holds once written: senders write -0.0 as +0.0 (the sum is
// the same). Operation j (counted in `lamport_seq`, the same on every rank) pushes this rank's
// input into slot `rank` of buffer j % 3 of every rank, then polls its own buffer until no
// element of a pack it reduces is 0x8000. While its peers' data travels it refills buffer
// (j - 1) % 3, which operation j - 1 left behind (`lamport_dirty` says how much). Three buffers
// are enough: a peer can be at most one operation ahead (operation j + 1 needs this rank's
// input of j + 1), so while this rank works in buffer j % 3 and refills (j - 1) % 3, peers write
// at most into (j + 1) % 3; and a peer writes buffer (j - 1) % 3 again only in operation j + 2,
// which starts after it has seen this rank's input of j + 1, pushed by a kernel that starts
// after this one, refill included, has completed. The Lamport two-shot keeps the same rotation:
// its slots hold the pushed slices first and the pushed sums after them, and no rank finishes
// an operation before every rank has pushed into it.

/// Bytes of every slot that the Lamport two-shot uses for a message of `bytes` bytes among
/// `world_size` ranks: one slice of 16-byte packs pushed in, one slice of sums pushed back.
constexpr std::int64_t lamport_two_shot_slot_bytes(std::int64_t bytes, int world_size) {
  const std::int64_t packs = (bytes + 15) / 16;
  return 2 * ((packs + world_size - 1) / world_size) * 16;
}
static_assert(lamport_two_shot_slot_bytes(1 << 20, 8) == 256 << 10);
static_assert(lamport_two_shot_slot_bytes(17, 4) == 32);

/// Byte offsets of the parts of one rank's workspace (the same on every rank).
struct WorkspaceLayout {
  std::int64_t signal = 0;      // SignalPad
  std::int64_t staging = 0;     // two halves of `half_bytes`
  std::int64_t scratch = 0;     // two-shot's reduced slices, `half_bytes`
  std::int64_t half_bytes = 0;  // capacity of one staging half, in bytes
  std::int64_t lamport = 0;     // kLamportBuffers x world_size slots of `lamport_slot_bytes`
  std::int64_t lamport_slot_bytes = 0;  // capacity of one rank's slot; 0: no Lamport buffers
  std::int64_t total = 0;

  /// The layout for messages of up to `max_bytes` bytes, and Lamport messages of up to
  /// `lamport_max_bytes` bytes among `world_size` ranks.
  static constexpr WorkspaceLayout make(std::int64_t max_bytes, std::int64_t lamport_max_bytes = 0,
                                        int world_size = 0) {
    constexpr std::int64_t kAlign = 256;
    auto round_up = [](std::int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
    WorkspaceLayout l;
    l.half_bytes = round_up(max_bytes);
    l.signal = 0;
    l.staging = round_up(static_cast<std::int64_t>(sizeof(SignalPad)));
    l.scratch = l.staging + 2 * l.half_bytes;
    l.lamport = l.scratch + l.half_bytes;
    l.lamport_slot_bytes = round_up(lamport_max_bytes);
    l.total = l.lamport + kLamportBuffers * world_size * l.lamport_slot_bytes;
    return l;
  }

  /// Offset of rank `slot`'s slot in Lamport buffer `buffer`.
  constexpr std::int64_t lamport_slot(int buffer, int slot, int world_size) const {
    return lamport + (static_cast<std::int64_t>(buffer) * world_size + slot) * lamport_slot_bytes;
  }
};
static_assert(WorkspaceLayout::make(100).half_bytes == 256);
static_assert(WorkspaceLayout::make(8 << 20).scratch % 256 == 0);
static_assert(WorkspaceLayout::make(100).total == WorkspaceLayout::make(100).lamport);
static_assert(WorkspaceLayout::make(256, 1000, 4).total ==
              WorkspaceLayout::make(256).lamport + 3 * 4 * 1024);

/// Where a kernel reports that it gave up waiting. Lives in host-mapped memory: the host reads
/// it without synchronising. `code` is 0 while healthy; the first block to fail writes it (the
/// other fields first, then `code`).
struct ErrorWord {
  static constexpr std::uint32_t kTimeout = 1;
  static constexpr std::uint32_t kAborted = 2;
  /// A peer's operation has another fingerprint (NOTE [fingerprints]); the host reads which from
  /// the peer's `SignalPad::posted_fingerprint`.
  static constexpr std::uint32_t kMismatch = 3;

  /// Which count `op` is.
  static constexpr std::uint32_t kBarrierCount = 0;  // `SignalPad::seq`
  static constexpr std::uint32_t kLamportCount = 1;  // `SignalPad::lamport_seq`

  std::uint32_t code;
  std::uint32_t rank;     // the rank whose word it is (written by the host)
  std::uint32_t peer;     // the peer it was waiting for
  std::uint32_t block;    // the block that was waiting
  std::uint32_t counter;  // kBarrierCount or kLamportCount: which count numbers its operations
  /// Nonzero once the host asked every kernel of the rank to give up (`CustomAllReduce::abort`).
  std::uint32_t abort;
  /// This rank's `SignalPad::failed`, as the kernels address it (written by the host): a report
  /// marks the rank failed through it. Here rather than in the kernels' wait context, so that
  /// only the failure path reads it (NOTE [bounded waits] in kernels/common/sync.cuh).
  std::uint32_t* failed;
};
static_assert(sizeof(ErrorWord) == 32);

}  // namespace tpcomm
