// SPDX-License-Identifier: Apache-2.0
// Lamport all-reduce (push): every rank writes its input straight into a slot of every rank's
// receive buffer and polls its own buffer until every slot holds data; no barrier round trip.
// 16-bit types only: the "not yet written" mark is the 16-bit pattern 0x8000 (NOTE [lamport]
// in ipc/layout.hpp). The small-message algorithm where latency matters most.
#pragma once

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

template <class T, int R>
__global__ void __launch_bounds__(1024) all_reduce_lamport_kernel(AllReduceParams p) {
  static_assert(sizeof(T) == 2, "the empty mark is a 16-bit pattern");
  begin_launch();
  const std::int64_t count = p.count;
  const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t slot_bytes = p.layout.lamport_slot_bytes;
  const T* in = static_cast<const T*>(p.input);
  const bool in_aligned = is_aligned16(in);
  // The first input pack is loaded while the block reads the operation count.
  Pack<T> head{};
  if (first < packs) head = load_pack(in, first, count, in_aligned);
  SignalPad* self = p.pads[p.rank];
  __shared__ std::uint32_t seq_shared, dirty_shared[kLamportBuffers];
  if (threadIdx.x == 0) {
    seq_shared = self->lamport_seq[blockIdx.x] + 1u;
#pragma unroll
    for (int b = 0; b < kLamportBuffers; ++b) dirty_shared[b] = self->lamport_dirty[b];
  }
  __syncthreads();
  const std::uint32_t seq = seq_shared;
  const int buffer = static_cast<int>(seq % kLamportBuffers);
  const int previous = static_cast<int>((seq + kLamportBuffers - 1) % kLamportBuffers);

  // Push this rank's input into slot `rank` of every rank's buffer.
  const std::int64_t slot_offset = static_cast<std::int64_t>(p.rank) * slot_bytes;
  for (std::int64_t v = first; v < packs; v += stride) {
    const uint4 x =
        lamport_outgoing(v == first ? head.raw : load_pack(in, v, count, in_aligned).raw);
#pragma unroll
    for (int r = 0; r < R; ++r) st_volatile(lamport_buffer(p, r, buffer) + slot_offset + v * 16, x);
  }

  // Refill what the previous operation left in its buffer while the peers' data travels.
  {
    const std::int64_t dirty_packs = dirty_shared[previous] / 16;
    char* stale = lamport_buffer(p, p.rank, previous);
    constexpr std::uint32_t kEmpty2 = kLamportEmpty * 0x10001u;  // two empty elements
    const uint4 empty = make_uint4(kEmpty2, kEmpty2, kEmpty2, kEmpty2);
#pragma unroll
    for (int s = 0; s < R; ++s)
      for (std::int64_t i = first; i < dirty_packs; i += stride)
        reinterpret_cast<uint4*>(stale + s * slot_bytes)[i] = empty;
  }

  // Poll this rank's buffer; reduce every pack in rank order once all slots hold it.
  const char* mine = lamport_buffer(p, p.rank, buffer);
  const WaitContext wait{p.timeout_ns, p.abort_flag, p.error, p.rank};
  T* out = static_cast<T*>(p.output);
  const bool out_aligned = is_aligned16(out);
  bool ok = true;
  for (std::int64_t v = first; v < packs && ok; v += stride) {
    Pack<T> got[R];
#pragma unroll
    for (int r = 0; r < R; ++r) got[r].raw = ld_volatile(mine + r * slot_bytes + v * 16);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint4 x = got[r].raw;
      if (ok && !lamport_arrived(x)) {
        const char* at = mine + r * slot_bytes + v * 16;
        ok = wait_until(
            [&] {
              x = ld_volatile(at);
              return lamport_arrived(x);
            },
            wait, r);
      }
      got[r].raw = x;
    }
    if (ok) store_pack(out, v, count, out_aligned, sum_packs<T, R>(got));
  }
  if (!__syncthreads_and(ok)) return;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    self->lamport_dirty[buffer] = static_cast<std::uint32_t>(packs * 16);
  end_launch(self->lamport_seq, seq);
}

}  // namespace tpcomm::kernels
