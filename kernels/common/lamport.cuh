// SPDX-License-Identifier: Apache-2.0
// What the Lamport kernels share: the empty mark, polling, the rotation of the receive buffers
// and their refill (NOTE [lamport] in ipc/layout.hpp). 16-bit element types only.
#pragma once

#include <cstdint>

#include "kernels/common/lamport_mark.hpp"
#include "kernels/common/poison.cuh"
#include "kernels/common/workspace.cuh"

namespace tpcomm::kernels {

/// Pack `x` as sent: -0.0 (the empty mark) becomes +0.0, which adds the same.
__device__ __forceinline__ uint4 lamport_outgoing(uint4 x) {
  return make_uint4(lamport_outgoing_word(x.x), lamport_outgoing_word(x.y),
                    lamport_outgoing_word(x.z), lamport_outgoing_word(x.w));
}

/// A pack of empty marks.
__device__ __forceinline__ uint4 lamport_empty_pack() {
  return make_uint4(kEmpty2, kEmpty2, kEmpty2, kEmpty2);
}

/// True once no 16-bit element of `x` holds the empty mark.
__device__ __forceinline__ bool lamport_arrived(uint4 x) {
  return (lamport_word_has_empty(x.x) | lamport_word_has_empty(x.y) | lamport_word_has_empty(x.z) |
          lamport_word_has_empty(x.w)) == 0;
}

/// 16-byte loads and stores that go to memory every time (peers write what this rank polls).
__device__ __forceinline__ uint4 ld_volatile(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

/// Lamport buffer `buffer` of rank `owner`, as mapped here; slot s starts
/// `s * layout.lamport_slot_bytes` bytes in. (`Params`: `AllReduceParams` or `ExchangeParams`,
/// as for every function here that takes them.)
template <class Params>
__device__ __forceinline__ char* lamport_buffer(const Params& p, int owner, int buffer) {
  return p.workspaces[owner] + p.layout.lamport_slot(buffer, 0, p.world_size);
}

/// True once neither half of header word `w` holds the empty mark.
__device__ __forceinline__ bool lamport_header_arrived(std::uint32_t w) {
  return lamport_word_has_empty(w) == 0;
}

__device__ __forceinline__ std::uint32_t ld_volatile_u32(const std::uint32_t* p) {
  std::uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Where one launch of a Lamport kernel works (NOTE [lamport]).
struct LamportFrame {
  std::uint32_t seq;   // this operation's Lamport number
  int buffer;          // the buffer it writes and polls
  int previous;        // the buffer the previous Lamport operation left behind
  std::int64_t stale;  // bytes per slot that operation used
  bool failed;         // this rank has failed: give up at once (NOTE [bounded waits])
  WaitContext wait;
};

/// Reads the operation number and what the previous operation left. Every thread calls it,
/// after `begin_launch`.
template <class Params>
__device__ __forceinline__ LamportFrame lamport_frame(const Params& p) {
  __shared__ std::uint32_t seq_shared, failed_shared, dirty_shared[kLamportBuffers];
  SignalPad* self = p.pads[p.rank];
  LamportFrame f;
  f.wait = wait_context(p);
  if (threadIdx.x == 0) {
    // All three sizes, read together with the count: which one matters depends on the count,
    // and waiting for it first would put a second load on the critical path. Loaded into
    // registers before any shared-memory store, which would order the loads after it.
    std::uint32_t dirty[kLamportBuffers];
#pragma unroll
    for (int b = 0; b < kLamportBuffers; ++b) dirty[b] = self->lamport_dirty[b];
    const OperationStart start = start_operation(self, self->lamport_seq, p.fingerprint, p.call);
#pragma unroll
    for (int b = 0; b < kLamportBuffers; ++b) dirty_shared[b] = dirty[b];
    seq_shared = start.seq;
    failed_shared = start.failed;
    self->lamport_started[blockIdx.x] = start.seq;  // NOTE [bounded waits]
  }
  __syncthreads();
  f.seq = seq_shared;
  f.buffer = static_cast<int>(f.seq % kLamportBuffers);
  f.previous = static_cast<int>((f.seq + kLamportBuffers - 1) % kLamportBuffers);
  f.stale = dirty_shared[f.previous];
  f.failed = failed_shared != 0;
  return f;
}

/// Every rank, as the `to` of `lamport_push_header`.
struct EveryRank {
  __device__ __forceinline__ bool operator()(int /*rank*/) const { return true; }
};

/// Pushes this operation's header into the buffer of every rank d for which `to(d)` holds
/// (block 0, thread d), before any data (NOTE [fingerprints]); every rank by default.
template <int R, class Params, class To = EveryRank>
__device__ __forceinline__ void lamport_push_header(const Params& p, const LamportFrame& f,
                                                    To to = {}) {
  const int d = static_cast<int>(threadIdx.x);
  if (blockIdx.x != 0 || d >= R || !to(d)) return;
  *reinterpret_cast<volatile std::uint32_t*>(&p.pads[d]->lamport_fingerprint[f.buffer][p.rank]) =
      lamport_header(p.fingerprint);
}

/// Thread t < R's check of rank t's header of this operation's buffer (NOTE [fingerprints]). The
/// header is loaded with the thread's packs, in the same round trips (`lamport_poll`), until it
/// has arrived: the peer pushed it before its data, so it has nearly always arrived by the time
/// the data has, and `lamport_end` has nothing left to load. Other threads load nothing.
template <int R>
struct LamportHeader {
  const std::uint32_t* at;
  std::uint32_t expected;  // this operation's header
  bool pending;            // a header to check that has not arrived yet
  bool same = true;        // the header that arrived is `expected`

  /// Thread t < R checks rank t's header where `checks` holds.
  template <class Params>
  __device__ __forceinline__ LamportHeader(const Params& p, const LamportFrame& f,
                                           bool checks = true)
      : at(&p.pads[p.rank]->lamport_fingerprint[f.buffer][threadIdx.x < R ? threadIdx.x : 0]),
        expected(lamport_header(p.fingerprint)),
        pending(threadIdx.x < R && checks) {}

  /// Issues a load of the header while it has not arrived; `see` takes the value, so that loads
  /// issued in between travel with it.
  __device__ __forceinline__ std::uint32_t load() const {
    return pending ? ld_volatile_u32(at) : 0u;
  }
  __device__ __forceinline__ void see(std::uint32_t header) {
    if (!pending || !lamport_header_arrived(header)) return;
    pending = false;
    same = header == expected;
  }
};

/// In place of a `LamportHeader` where a loop has no register to spare for it.
struct NoHeader {
  __device__ __forceinline__ std::uint32_t load() const { return 0; }
  __device__ __forceinline__ void see(std::uint32_t /*header*/) {}
};

/// This thread's first index in a loop over the grid (stride gridDim.x * blockDim.x) whose warps
/// take turns across the blocks: warp w of block b starts at (w * gridDim.x + b) * 32 + its lane.
/// A message shorter than the grid's threads thus reaches every block, a warp's worth at a time,
/// where a block-major order would leave it to the first blocks: a small message's stores spread
/// over the SMs (NOTE [row groups]: a fused kernel's blocks past its rows only push). blockDim.x
/// is a multiple of 32.
__device__ __forceinline__ std::int64_t spread_first() {
  return ((threadIdx.x / 32) * gridDim.x + blockIdx.x) * 32 + threadIdx.x % 32;
}

/// Refills with the empty mark what the previous operation left in this rank's buffer; blocks
/// `block` of `blocks` (by default the grid) share the work, in the order of `spread_first`.
/// Called while the peers' data travels.
template <int R, class Params>
__device__ __forceinline__ void lamport_refill(const Params& p, const LamportFrame& f,
                                               unsigned block = blockIdx.x,
                                               unsigned blocks = gridDim.x) {
  const std::int64_t first = ((threadIdx.x / 32) * blocks + block) * 32 + threadIdx.x % 32;
  const std::int64_t stride = static_cast<std::int64_t>(blocks) * blockDim.x;
  const std::int64_t packs = f.stale / 16;
  char* stale = lamport_buffer(p, p.rank, f.previous);
  const uint4 empty = lamport_empty_pack();
#pragma unroll
  for (int s = 0; s < R; ++s)
    for (std::int64_t i = first; i < packs; i += stride)
      reinterpret_cast<uint4*>(stale + s * p.layout.lamport_slot_bytes)[i] = empty;
  if (first < R) p.pads[p.rank]->lamport_fingerprint[f.previous][first] = kEmpty2;
}

/// Polls the pack at `offset` bytes into slots 0..`slots`-1 of `buffer` (this rank's, as
/// mapped here) until none holds the empty mark; the packs in `got`. The packs still missing after
/// the first loads are loaded again together, in one wait, until none is left (one loop in the
/// kernel's code, not one a slot). Until the thread's `header` has arrived, every load of it
/// travels with the loads of the packs. False when a wait gave up (NOTE [bounded waits]).
template <class T, int R, class Header>
__device__ __forceinline__ bool lamport_poll(const char* buffer, std::int64_t slot_bytes,
                                             std::int64_t offset, Pack<T> (&got)[R], Header& header,
                                             const WaitContext& w, int slots = R) {
  const std::uint32_t h = header.load();
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < slots) got[r].raw = ld_volatile(buffer + r * slot_bytes + offset);
  header.see(h);
  unsigned missing = 0;  // bit r: slot r's pack has not arrived
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < slots && !lamport_arrived(got[r].raw)) missing |= 1u << r;
  if (missing == 0) return true;
  return wait_until<ErrorWord::kLamportCount>(
      [&] {
        const std::uint32_t seen = header.load();
#pragma unroll
        for (int r = 0; r < R; ++r)
          if ((missing >> r) & 1u) got[r].raw = ld_volatile(buffer + r * slot_bytes + offset);
        header.see(seen);
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (((missing >> r) & 1u) && lamport_arrived(got[r].raw)) missing &= ~(1u << r);
        return missing == 0;
      },
      w, [&] { return __ffs(static_cast<int>(missing)) - 1; });
}

/// Polls the pack at `at` until it holds no empty mark; false when the wait gave up, naming
/// `peer` as the rank waited for.
template <class T>
__device__ __forceinline__ bool lamport_poll_one(const char* at, Pack<T>& got, const WaitContext& w,
                                                 int peer) {
  uint4 x = ld_volatile(at);
  bool ok = true;
  if (!lamport_arrived(x))
    ok = wait_until<ErrorWord::kLamportCount>(
        [&] {
          x = ld_volatile(at);
          return lamport_arrived(x);
        },
        w, peer);
  got.raw = x;
  return ok;
}

/// Thread t < R: whether rank t's header (`h`, polled until it arrives if `lamport_poll` did not
/// see it) carries this operation's fingerprint; kMismatch reported where not (NOTE
/// [fingerprints]). True in other threads.
template <int R>
__device__ __forceinline__ bool lamport_check_header(const LamportFrame& f, LamportHeader<R> h) {
  const int t = static_cast<int>(threadIdx.x);
  if (t >= R) return true;
  if (h.pending && !wait_until<ErrorWord::kLamportCount>(
                       [&] {
                         h.see(h.load());
                         return !h.pending;
                       },
                       f.wait, t))
    return false;
  if (h.same) return true;
  // The host names the peer's call from its posted fingerprint (the header holds a hash).
  report<ErrorWord::kLamportCount>(f.wait, ErrorWord::kMismatch, t);
  return false;
}

/// Ends a Lamport launch that used `used` bytes of every slot: checks the peers' headers
/// (`header`), records the bytes for the next operation's refill and
/// the new operation count (`end_launch`). Every thread calls it with its own `ok`; after a
/// failed wait or check it records nothing and poisons the outputs (NOTE [poisoned outputs]).
template <class T, int R>
__device__ __forceinline__ void lamport_end(const AllReduceParams& p, const LamportFrame& f,
                                            bool ok, std::int64_t used,
                                            const LamportHeader<R>& header) {
  ok = ok && lamport_check_header<R>(f, header);
  if (!__syncthreads_and(ok)) return poison_outputs_block<T>(p);
  SignalPad* self = p.pads[p.rank];
  if (blockIdx.x == 0 && threadIdx.x == 0)
    self->lamport_dirty[f.buffer] = static_cast<std::uint32_t>(used);
  end_launch(self->lamport_seq, f.seq);
}

}  // namespace tpcomm::kernels
