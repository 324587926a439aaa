// SPDX-License-Identifier: Apache-2.0
// Lamport all-reduce (push): every rank writes its input straight into a slot of every rank's
// receive buffer and polls its own buffer until every slot holds data; no barrier round trip.
// 16-bit types only: the "not yet written" mark is the 16-bit pattern 0x8000 (NOTE [lamport]
// in ipc/layout.hpp). The small-message algorithm where latency matters most.
#pragma once

#include "kernels/common/epilogue.cuh"
#include "kernels/common/lamport.cuh"

namespace tpcomm::kernels {

template <class T, int R, class Epilogue>
__global__ void __launch_bounds__(Epilogue::kMaxThreads, 1)
    all_reduce_lamport_kernel(AllReduceParams p) {
  static_assert(sizeof(T) == 2, "the empty mark is a 16-bit pattern");
  begin_launch();
  if (p.count == 0) return;  // a warm-up launch: nothing to do (NOTE [first launch])
  const std::int64_t count = p.count;
  const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
  // The packs this thread pushes, and without a row step polls (`spread_first`).
  const std::int64_t first = spread_first();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t slot_bytes = p.layout.lamport_slot_bytes;
  const T* in = static_cast<const T*>(p.input);
  const bool in_aligned = is_aligned16(in);
  // The first input pack is loaded while the block reads the operation count (then each next one
  // while the last is pushed).
  Pack<T> head{};
  if (first < packs) head = Epilogue::template input<T>(p, in, first, in_aligned);
  const LamportFrame f = lamport_frame(p);
  // A failed rank gives up at once (NOTE [bounded waits]): it pushes nothing, waits for nothing
  // and poisons its outputs in `lamport_end` (with a row epilogue, after the row step, whose
  // groups of blocks meet in every row: NOTE [row groups]).
  if (!f.failed) {
    lamport_push_header<R>(p, f);
    // Push this rank's input into slot `rank` of every rank's buffer. The next pack is read
    // before this one is pushed: a push is ordered before every later load (the volatile store).
    const std::int64_t own_slot = static_cast<std::int64_t>(p.rank) * slot_bytes;
    for (std::int64_t v = first; v < packs; v += stride) {
      const uint4 x = lamport_outgoing(head.raw);
      if (v + stride < packs) head = Epilogue::template input<T>(p, in, v + stride, in_aligned);
#pragma unroll
      for (int r = 0; r < R; ++r)
        st_volatile(lamport_buffer(p, r, f.buffer) + own_slot + v * 16, x);
    }
    // With a row step, the blocks past the rows (if any) refill, and the row blocks go on to
    // poll (NOTE [row groups]).
    unsigned row_blocks = gridDim.x;
    if constexpr (Epilogue::kRows) {
      unsigned size = 1;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
      size = cooperative_groups::this_cluster().num_blocks();
#endif
      row_blocks = static_cast<unsigned>(
          min(static_cast<std::int64_t>(gridDim.x), count / p.fusion.hidden * size));
    }
    if (row_blocks == gridDim.x)
      lamport_refill<R>(p, f);
    else if (blockIdx.x >= row_blocks)
      lamport_refill<R>(p, f, blockIdx.x - row_blocks, gridDim.x - row_blocks);
  }
  LamportHeader<R> header(p, f);  // NOTE [fingerprints]

  // Poll this rank's buffer; reduce every pack in rank order once all slots hold it.
  const char* mine = lamport_buffer(p, p.rank, f.buffer);
  T* out = static_cast<T*>(p.output);
  const bool out_aligned = is_aligned16(out);
  const Epilogue epilogue(p);
  bool ok = !f.failed;
  if constexpr (Epilogue::kRows) {
    ok = finish_rows<T, /*kBareSums=*/true>(
        epilogue, out, count, p.early_launch, [&](std::int64_t v, Pack<T>& x) {
          Pack<T> got[R];
          if (f.failed || !lamport_poll<T, R>(mine, slot_bytes, v * 16, got, header, f.wait))
            return false;
          x = sum_packs<T, R>(got);
          return true;
        });
  } else {
    for (std::int64_t v = first; v < packs && ok; v += stride) {
      Pack<T> got[R];
      ok = lamport_poll<T, R>(mine, slot_bytes, v * 16, got, header, f.wait);
      if (ok)
        store_pack(out, v, count, out_aligned, epilogue(sum_packs<T, R>(got), v * Pack<T>::kElems));
    }
    if (ok && p.early_launch) allow_next_launch();  // NOTE [programmatic launch]
  }
  lamport_end<T, R>(p, f, ok, packs * 16, header);
}

}  // namespace tpcomm::kernels
