// SPDX-License-Identifier: Apache-2.0
// Cross-rank synchronisation primitives and the memory-ordering contract of every kernel.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ipc/layout.hpp"
#include "kernels/common/fingerprint_hash.hpp"

namespace tpcomm::kernels {

// NOTE [memory ordering]
// Ranks communicate through peer-mapped memory (NVLink, or one GPU's memory for virtual
// ranks). Kernels use exactly these patterns:
//
//  (1) Publish-then-signal. A block writes data that peers will read (its staging copy, its
//      reduced slice), then `barrier_block`: `__syncthreads()` orders the whole block's writes
//      before thread t's `st.release.sys` of the flag in peer t's signal pad (release is
//      cumulative over what the block wrote before the CTA barrier).
//  (2) Wait-then-read. Thread t spins with `ld.acquire.sys` on its own pad until peer t's flag
//      reaches the expected value; the closing `__syncthreads_and` extends that acquire to every
//      thread of the block before any of them reads the peer's data.
//  (3) Reuse after barrier. A buffer that peers read is overwritten only after a later barrier
//      proves they are done with it (NOTE [staging] in ipc/layout.hpp).
//
// All of it at system scope: peers may be other GPUs, and flags are one 32-bit word per
// (block, peer) with one writer each (NOTE [signal pad]).

// NOTE [bounded waits]
// No wait spins forever. Every spin polls a deadline (`%globaltimer`, checked every 64 spins)
// and a host-mapped abort flag (every 1024 spins). On either it records what happened in the
// host-mapped ErrorWord and in its own signal pad's `failed` word, and the whole block returns
// early, poisoning its outputs (NOTE [poisoned outputs]); the host reads the word from its
// watchdog thread and before the group's next call, and from then on answers
// kTimeout/kAborted/kMismatch. Once a rank has failed, every later kernel of the rank gives up at
// its start (it reads `failed` with the operation count, at no cost), and every wait already
// spinning gives up at its next abort poll, so the operations queued behind a failed one (a whole
// graph of them, replayed again and again) finish in microseconds with poisoned outputs and can
// never complete on stale data. It never traps, so the CUDA context survives and the process can
// build a new group. The report names the operation; the host then reads how far the awaited
// peer's block got (for the barrier kernels, the last barrier value it published to this rank;
// for the Lamport kernels, its `SignalPad::lamport_started`) and which call it last started
// (`SignalPad::posted_call`), so the message can say whether the peer never began the operation
// (its stream was held, NOTE [first launch] in backends/custom_ar.cpp), was stuck inside it, or
// was in another collective. None of this is on the kernels' fast path.

// NOTE [fingerprints]
// Every operation carries a 64-bit fingerprint of the call (the operation, dtype, element count
// and shape parameters; backends/fingerprint.hpp), the same on every rank for the same call,
// keyed by the group's call number (`keyed_fingerprint`: the number times an odd constant, XORed
// into the low 32 bits, so that numbers less than 2^30 apart differ in every hash below), and the
// call number itself. The number counts the group's collective calls on the host; a captured
// call keeps the number it was captured with, so a graph replays the same keys. So ranks whose
// calls are out of step differ wherever a call meets a peer's other call of the same shape: an
// eager call against a graph's replayed one (a rank that skipped or repeated a replay, then calls
// on), two graphs (one replayed by a rank that skipped the other), or calls served by different
// kinds of kernel or by NCCL, whose own operation counts (`SignalPad::seq`, `lamport_seq`) pair
// calls that the group's count does not. A count kept on the device would add nothing: the
// kernels pair operations by position, so it would equal its peers' wherever the host's does.
// What no count can tell apart is a rank that skips one of several calls of the same shape and
// goes on with the same calls as its peers (eager, or replays of one graph): the calls pair one
// late, with equal numbers, until the last unpaired call meets its deadline, whose report names
// the call each rank last started. Capture scopes compare the captured numbers when they close.
// Kernels check the fingerprints of the peers whose data they take:
//  - the barrier kernels (one-shot, two-shot, the exchange): a barrier flag is 64 bits, the
//    barrier value and a 32-bit hash of the fingerprint, stored and loaded as one word, so the
//    check costs no memory operation. A waiter that finds the peer's flag exactly at its barrier
//    compares the hashes; one that finds it past the barrier need not, since the peer passed the
//    barrier only after finding this rank's flag there with an equal hash (the first of two ranks
//    to pass a barrier always saw the other exactly at it);
//  - the Lamport all-reduce kernels: block 0 (thread d for rank d) pushes a 32-bit header with 30
//    bits of the same hash into every rank's `SignalPad::lamport_fingerprint` of the buffer it
//    pushes into, before its data. Thread t < R of every block loads rank t's header together
//    with its own packs, in the same round trips, until it has arrived, and compares it before
//    the block ends (polling on only if it had not arrived with the data): a block that finds a
//    difference poisons the outputs after its own stores, so every element ends poisoned, and fails
//    the operation, which makes the blocks still waiting for data that will never come give up too.
//    One word in one register, loaded beside loads the thread makes anyway: a 16-byte header, or
//    one loaded on its own after the data, as first built, cost registers or a round trip
//    (docs/PERFORMANCE.md);
//  - the exchange's push form: every line it pushes carries the header as its flag, and a line
//    with another flag fails the operation (NOTE [exchange push] in kernels/exchange_push.cu), so
//    it pushes and checks a header only between ranks that exchange no lines.
// A difference fails the operation with kMismatch on every rank that sees it, naming both calls.
// Ranks whose calls took different kinds of kernel (a Lamport kernel on one, a barrier kernel or
// NCCL on another) never meet: they wait until the deadline, and the host then reads the peer's
// `posted_fingerprint` and `posted_call` (block 0 of every kernel writes them at its start) and
// names the mismatch when the peer is in the same call with another fingerprint.

__device__ __forceinline__ std::uint64_t globaltimer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ std::uint64_t ld_acquire_sys(const std::uint64_t* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/// True once a flag that only grows has reached `target`, across 32-bit wrap-around.
__device__ __forceinline__ bool reached(std::uint32_t value, std::uint32_t target) {
  return static_cast<std::int32_t>(value - target) >= 0;
}

/// Where a wait gives up: its deadline, and the rank's host-mapped error word, which also holds
/// the abort flag. Two values: a wait is inlined into loops that are short of registers.
struct WaitContext {
  std::uint64_t timeout_ns;  // 0 = no deadline
  ErrorWord* error;
};

/// The wait context of a kernel's parameters (`AllReduceParams` or `ExchangeParams`).
template <class Params>
__device__ __forceinline__ WaitContext wait_context(const Params& p) {
  return WaitContext{p.timeout_ns, p.error};
}

/// Records in the host-mapped error word that this block gave up waiting for `peer` (`code`),
/// and which count (`Counter`: ErrorWord::kBarrierCount or kLamportCount) numbers its operations;
/// the host then reads which operation and call it was (this rank's posted call) and how far that
/// peer got (NOTE [bounded waits]). Marks the rank failed, so that its later kernels give up at
/// their start.
template <std::uint32_t Counter>
__device__ __forceinline__ void report(const WaitContext& w, std::uint32_t code, int peer) {
  volatile ErrorWord* e = w.error;
  volatile std::uint32_t* failed = e->failed;
  // A mismatch seen once the rank has failed is not news, and may not be one: an operation that
  // gave up left its buffer's Lamport headers unrefilled, so a later block can find the header
  // of an earlier call there (NOTE [fingerprints]). The rank's first failure stands.
  if (code == ErrorWord::kMismatch && *failed != 0) return;
  e->peer = static_cast<std::uint32_t>(peer);
  e->block = blockIdx.x;
  e->counter = Counter;
  *failed = code;
  __threadfence_system();
  e->code = code;
}

/// `peer` as a rank: an int, or a callable that says which rank is still awaited.
template <class Peer>
__device__ __forceinline__ int rank_of(const Peer& peer) {
  if constexpr (std::is_invocable_v<const Peer&>)
    return peer();
  else
    return peer;
}

/// Spins until `ready()` returns true. False when it gave up (NOTE [bounded waits]); `peer` is
/// the rank named in the report (or a callable that names it then), `Counter` the count that
/// numbers this kernel's operations.
template <std::uint32_t Counter, class Ready, class Peer>
__device__ __forceinline__ bool wait_until(Ready&& ready, const WaitContext& w, const Peer& peer) {
  if (ready()) return true;
  const std::uint64_t start = globaltimer_ns();
  for (std::uint32_t spins = 1;; ++spins) {
    if (ready()) return true;
    if ((spins & 63u) == 0) {
      if (w.timeout_ns != 0 && globaltimer_ns() - start > w.timeout_ns) {
        report<Counter>(w, ErrorWord::kTimeout, rank_of(peer));
        return false;
      }
      if ((spins & 1023u) == 0) {
        if (reinterpret_cast<const volatile ErrorWord*>(w.error)->abort != 0) {
          report<Counter>(w, ErrorWord::kAborted, rank_of(peer));
          return false;
        }
        // An earlier wait of this rank gave up: so does this one, instead of waiting out its
        // own deadline (a graph of many operations would otherwise take that many deadlines).
        if (reinterpret_cast<const volatile ErrorWord*>(w.error)->code != 0) return false;
      }
    }
  }
}

/// Spins until the barrier value of `*flag` (its low half) reaches `target` (pattern 2); the
/// flag as last read in `*seen`. False when it gave up (NOTE [bounded waits]).
__device__ inline bool wait_flag(const std::uint64_t* flag, std::uint32_t target,
                                 const WaitContext& w, int peer, std::uint64_t* seen) {
  return wait_until<ErrorWord::kBarrierCount>(
      [&] {
        *seen = ld_acquire_sys(flag);
        return reached(static_cast<std::uint32_t>(*seen), target);
      },
      w, peer);
}

/// Barrier of this block with block `blockIdx.x` of every peer (patterns 1 and 2), checking that
/// every peer is in an operation with this one's `fingerprint` (NOTE [fingerprints]). `pads[r]` is
/// rank r's signal pad as mapped here; `value` is `seq * kPhases + phase`. Every thread of the
/// block must call it; returns false in every thread when any wait gave up or a fingerprint
/// differed.
template <int R>
__device__ __forceinline__ bool barrier_block(SignalPad* const* pads, int rank, std::uint32_t value,
                                              std::uint64_t fingerprint, const WaitContext& w) {
  __syncthreads();
  bool ok = true;
  const int t = static_cast<int>(threadIdx.x);
  if (t < R && t != rank) {
    const std::uint64_t hash = flag_hash(fingerprint);
    st_release_sys(&pads[t]->flags[blockIdx.x][rank], hash << 32 | value);
    std::uint64_t seen = 0;
    ok = wait_flag(&pads[rank]->flags[blockIdx.x][t], value, w, t, &seen);
    // A peer already past this barrier checked this rank's hash at it (and would have failed
    // instead of moving on); one exactly at it is checked here.
    if (ok && static_cast<std::uint32_t>(seen) == value && (seen >> 32) != hash) {
      report<ErrorWord::kBarrierCount>(w, ErrorWord::kMismatch, t);
      ok = false;
    }
  }
  return __syncthreads_and(ok) != 0;
}

/// What thread 0 of a block reads at the start of an operation (`start_operation`).
struct OperationStart {
  std::uint32_t seq;     // this operation's number: the block's count + 1
  std::uint32_t failed;  // this rank's `failed` word (NOTE [bounded waits])
};

/// The start of every operation's kernel, after `begin_launch`: reads the block's operation
/// count (`SignalPad::seq` or `lamport_seq`, `count`) and this rank's `failed` word in one round
/// trip, both loads issued before either is used (a shared-memory store between them would order
/// them); while `failed` is zero, block 0 posts the operation's fingerprint and call number in
/// this rank's pad (NOTE [fingerprints]), so that after a failure the pad keeps the call that
/// failed. Thread 0 only; its caller shares the answer with the block through the barrier it
/// already has.
__device__ __forceinline__ OperationStart start_operation(SignalPad* self,
                                                          const std::uint32_t* count,
                                                          std::uint64_t fingerprint,
                                                          std::uint32_t call) {
  // Plain accesses: the count and `failed` were written by earlier kernels of this rank (or
  // `failed` by the host before the next call), and the posted call is read only after a wait
  // gave up.
  const std::uint32_t last = count[blockIdx.x];
  const std::uint32_t failed = self->failed;
  if (blockIdx.x == 0 && failed == 0) {
    self->posted_fingerprint = fingerprint;
    self->posted_call = call;
  }
  return OperationStart{last + 1u, failed};
}

// NOTE [programmatic launch]
// Launched with programmatic stream serialization (TPCOMM_PDL, on by default), a kernel may be
// scheduled while the kernel before it on the stream is still running, so its launch latency
// hides behind that kernel. So `begin_launch` is the first thing every kernel does: it waits
// until the previous kernel has completed and its writes are visible (the caller's input, the
// operation counts). A block calls `allow_next_launch` once it has passed its last wait for a
// peer (the Lamport kernels after their last poll of a pack, a fused kernel before the norm of
// its last row): from then on it only computes and stores, and every peer whose data it took is
// running. The blocks of the next kernel, scheduled once every block of this one got there, then
// hold room on the GPU while they wait: where ranks share a GPU, a rank whose own kernel has not
// been scheduled yet could find no room left (its peers spin for it until their deadline), so a
// kernel allows it only where the host found room for two of every rank's kernels at once
// (`early_launch`: at most half the blocks a rank may hold; `CustomAllReduce::run`). The Lamport
// header check that follows the last poll waits, if at all, for a header that a running peer
// pushed before its data. The next kernel waits for this one's completion before it touches
// anything (CUDA's rule for such launches), so it never sees this kernel's output early. Launched
// without the attribute, both instructions return at once.
// Programmatic dependent launch is Hopper's (sm_90) and later: before it, a launch always waits
// for the previous kernel to end, and both are nothing.
__device__ __forceinline__ void begin_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Ends a launch: records the new operation count in every entry of `counts` (this rank's
/// `SignalPad::seq` or `lamport_seq`) that this block stands for (NOTE [signal pad]). Blocks
/// that gave up skip this, so a failed launch leaves counts behind: the group is unusable after
/// a failure anyway.
__device__ __forceinline__ void end_launch(std::uint32_t* counts, std::uint32_t seq) {
  for (unsigned i = blockIdx.x + threadIdx.x * gridDim.x; i < kMaxBlocks;
       i += blockDim.x * gridDim.x)
    counts[i] = seq;
}

}  // namespace tpcomm::kernels
