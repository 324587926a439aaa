// SPDX-License-Identifier: Apache-2.0
// What the Lamport kernels share: the empty mark, polling, the rotation of the receive buffers
// and their refill (NOTE [lamport] in ipc/layout.hpp). 16-bit element types only.
#pragma once

#include <cstdint>

#include "kernels/common/poison.cuh"
#include "kernels/common/workspace.cuh"

namespace tpcomm::kernels {

/// Pack `x` as sent: -0.0 (the empty mark) becomes +0.0, which adds the same.
__device__ __forceinline__ uint4 lamport_outgoing(uint4 x) {
  auto fix = [](std::uint32_t w) {
    if ((w & 0xFFFFu) == kLamportEmpty) w &= 0xFFFF0000u;
    if ((w >> 16) == kLamportEmpty) w &= 0x0000FFFFu;
    return w;
  };
  return make_uint4(fix(x.x), fix(x.y), fix(x.z), fix(x.w));
}

/// A pack of empty marks.
__device__ __forceinline__ uint4 lamport_empty_pack() {
  constexpr std::uint32_t kEmpty2 = kLamportEmpty * 0x10001u;  // two empty elements
  return make_uint4(kEmpty2, kEmpty2, kEmpty2, kEmpty2);
}

/// True once no 16-bit element of `x` holds the empty mark.
__device__ __forceinline__ bool lamport_arrived(uint4 x) {
  auto empty = [](std::uint32_t w) {
    return (w & 0xFFFFu) == kLamportEmpty || (w >> 16) == kLamportEmpty;
  };
  return !(empty(x.x) || empty(x.y) || empty(x.z) || empty(x.w));
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
/// `s * layout.lamport_slot_bytes` bytes in.
__device__ __forceinline__ char* lamport_buffer(const AllReduceParams& p, int owner, int buffer) {
  return p.workspaces[owner] + p.layout.lamport_slot(buffer, 0, p.world_size);
}

/// The header that carries fingerprint `fp` in a Lamport buffer (NOTE [fingerprints]): one
/// byte of it in each 16-bit element, above a set bit 8, so that no element is the empty mark.
__device__ __forceinline__ uint4 lamport_header(std::uint64_t fp) {
  std::uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const auto lo = static_cast<std::uint32_t>((fp >> (16 * i)) & 0xFFu);
    const auto hi = static_cast<std::uint32_t>((fp >> (16 * i + 8)) & 0xFFu);
    w[i] = (0x0100u | lo) | (0x0100u | hi) << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// The fingerprint a header carries.
__device__ __forceinline__ std::uint64_t lamport_header_fingerprint(uint4 h) {
  const std::uint32_t w[4] = {h.x, h.y, h.z, h.w};
  std::uint64_t fp = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    fp |= static_cast<std::uint64_t>(w[i] & 0xFFu) << (16 * i) |
          static_cast<std::uint64_t>((w[i] >> 16) & 0xFFu) << (16 * i + 8);
  return fp;
}

/// What a thread checks before it first uses what its peers pushed: every rank's header in this
/// operation's buffer, against this operation's (NOTE [fingerprints]).
struct LamportCheck {
  const char* headers;  // this rank's `lamport_fingerprint[buffer]`, one 16-byte entry per rank
  uint4 expected;
};

/// Where one launch of a Lamport kernel works (NOTE [lamport]).
struct LamportFrame {
  std::uint32_t seq;   // this operation's Lamport number
  int buffer;          // the buffer it writes and polls
  int previous;        // the buffer the previous Lamport operation left behind
  std::int64_t stale;  // bytes per slot that operation used
  bool failed;         // this rank has failed: give up at once (NOTE [bounded waits])
  LamportCheck check;
  WaitContext wait;
};

/// Reads the operation number and what the previous operation left. Every thread calls it,
/// after `begin_launch`.
__device__ __forceinline__ LamportFrame lamport_frame(const AllReduceParams& p) {
  __shared__ std::uint32_t seq_shared, failed_shared, dirty_shared[kLamportBuffers];
  SignalPad* self = p.pads[p.rank];
  LamportFrame f;
  f.wait = wait_context(p);
  if (threadIdx.x == 0) {
    // All three sizes, read together with the count: which one matters depends on the count,
    // and waiting for it first would put a second load on the critical path.
    seq_shared = self->lamport_seq[blockIdx.x] + 1u;
#pragma unroll
    for (int b = 0; b < kLamportBuffers; ++b) dirty_shared[b] = self->lamport_dirty[b];
    failed_shared = start_operation(self, f.wait);
    self->lamport_started[blockIdx.x] = seq_shared;  // NOTE [bounded waits]
  }
  __syncthreads();
  f.seq = seq_shared;
  f.buffer = static_cast<int>(f.seq % kLamportBuffers);
  f.previous = static_cast<int>((f.seq + kLamportBuffers - 1) % kLamportBuffers);
  f.stale = dirty_shared[f.previous];
  f.failed = failed_shared != 0;
  f.check = LamportCheck{reinterpret_cast<const char*>(self->lamport_fingerprint[f.buffer]),
                         lamport_header(p.fingerprint)};
  return f;
}

/// Pushes this operation's header into every rank's buffer (block 0, thread 0), before any data
/// (NOTE [fingerprints]).
template <int R>
__device__ __forceinline__ void lamport_push_header(const AllReduceParams& p,
                                                    const LamportFrame& f) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    st_volatile(p.pads[r]->lamport_fingerprint[f.buffer][p.rank], f.check.expected);
}

/// Refills with the empty mark what the previous operation left in this rank's buffer; the
/// grid shares the work. Called while the peers' data travels.
template <int R>
__device__ __forceinline__ void lamport_refill(const AllReduceParams& p, const LamportFrame& f) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t packs = f.stale / 16;
  char* stale = lamport_buffer(p, p.rank, f.previous);
  const uint4 empty = lamport_empty_pack();
#pragma unroll
  for (int s = 0; s < R; ++s)
    for (std::int64_t i = first; i < packs; i += stride)
      reinterpret_cast<uint4*>(stale + s * p.layout.lamport_slot_bytes)[i] = empty;
  if (first < R)
    reinterpret_cast<uint4*>(p.pads[p.rank]->lamport_fingerprint[f.previous])[first] = empty;
}

/// Waits for the headers `h` (loaded from `c.headers`) to arrive and compares each with this
/// operation's; false when a wait gave up or one differs (reported as kMismatch).
template <int R>
__device__ __forceinline__ bool lamport_agree(const LamportCheck& c, uint4 (&h)[R],
                                              const WaitContext& w) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    uint4 x = h[r];
    if (!lamport_arrived(x)) {
      const char* at = c.headers + r * 16;
      if (!wait_until<ErrorWord::kLamportCount>(
              [&] {
                x = ld_volatile(at);
                return lamport_arrived(x);
              },
              w, r))
        return false;
    }
    if (x.x != c.expected.x || x.y != c.expected.y || x.z != c.expected.z || x.w != c.expected.w) {
      report<ErrorWord::kLamportCount>(w, ErrorWord::kMismatch, r, lamport_header_fingerprint(x));
      return false;
    }
  }
  return true;
}

/// Loads every rank's header of `check` (nothing when null); `lamport_agree` then checks them.
template <int R>
__device__ __forceinline__ void lamport_load_headers(const LamportCheck* check, uint4 (&h)[R]) {
  if (check == nullptr) return;
#pragma unroll
  for (int r = 0; r < R; ++r) h[r] = ld_volatile(check->headers + r * 16);
}

/// Polls the pack at `offset` bytes into slots 0..`slots`-1 of `buffer` (this rank's, as
/// mapped here) until none holds the empty mark; the packs in `got`. False when a wait gave up
/// (NOTE [bounded waits]).
/// With `check` (a thread's first poll), every rank's header is loaded with the packs and
/// checked before them (NOTE [fingerprints]), and `check` is then cleared.
template <class T, int R>
__device__ __forceinline__ bool lamport_poll(const char* buffer, std::int64_t slot_bytes,
                                             std::int64_t offset, Pack<T> (&got)[R],
                                             const WaitContext& w, const LamportCheck*& check,
                                             int slots = R) {
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r < slots) got[r].raw = ld_volatile(buffer + r * slot_bytes + offset);
  uint4 headers[R];
  lamport_load_headers<R>(check, headers);
  if (check != nullptr) {
    if (!lamport_agree<R>(*check, headers, w)) return false;
    check = nullptr;
  }
  bool ok = true;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    uint4 x = got[r].raw;
    if (ok && r < slots && !lamport_arrived(x)) {
      const char* at = buffer + r * slot_bytes + offset;
      ok = wait_until<ErrorWord::kLamportCount>(
          [&] {
            x = ld_volatile(at);
            return lamport_arrived(x);
          },
          w, r);
    }
    got[r].raw = x;
  }
  return ok;
}

/// Polls the pack at `at` until it holds no empty mark; false when the wait gave up, naming
/// `peer` as the rank waited for. `check` as for `lamport_poll`.
template <class T, int R>
__device__ __forceinline__ bool lamport_poll_one(const char* at, Pack<T>& got, const WaitContext& w,
                                                 int peer, const LamportCheck*& check) {
  uint4 x = ld_volatile(at);
  uint4 headers[R];
  lamport_load_headers<R>(check, headers);
  if (check != nullptr) {
    if (!lamport_agree<R>(*check, headers, w)) return false;
    check = nullptr;
  }
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

/// Ends a Lamport launch that used `used` bytes of every slot: records them for the next
/// operation's refill and the new operation count (`end_launch`). Every thread calls it with
/// its own `ok`; after a failed wait it records nothing and poisons the outputs (NOTE [poisoned
/// outputs]).
template <class T>
__device__ __forceinline__ void lamport_end(const AllReduceParams& p, const LamportFrame& f,
                                            bool ok, std::int64_t used) {
  if (!__syncthreads_and(ok)) return poison_outputs_block<T>(p);
  SignalPad* self = p.pads[p.rank];
  if (blockIdx.x == 0 && threadIdx.x == 0)
    self->lamport_dirty[f.buffer] = static_cast<std::uint32_t>(used);
  end_launch(self->lamport_seq, f.seq);
}

}  // namespace tpcomm::kernels
