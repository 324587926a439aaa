// SPDX-License-Identifier: Apache-2.0
// Lamport two-shot all-reduce (push): rank s owns slice s. Every rank pushes slice s of its
// input into slot `rank` of rank s's receive buffer; rank s reduces its slice as it arrives and
// pushes the sum into slot s of every rank's buffer, after the slice area; every rank copies
// the sums out as they arrive. About 2n bytes sent per rank, like two-shot, with no barrier
// round trip: data is its own flag (NOTE [lamport] in ipc/layout.hpp). 16-bit types only. With
// a row epilogue it also serves the reduce-scatter form (NOTE [scattered rows]).
#pragma once

#include "kernels/common/epilogue.cuh"
#include "kernels/common/lamport.cuh"

namespace tpcomm::kernels {

template <class T, int R, class Epilogue>
__global__ void __launch_bounds__(Epilogue::kMaxThreads, 1)
    all_reduce_lamport_two_shot_kernel(AllReduceParams p) {
  static_assert(sizeof(T) == 2, "the empty mark is a 16-bit pattern");
  begin_launch();
  if (p.count == 0) return;  // a warm-up launch: nothing to do (NOTE [first launch])
  const std::int64_t count = p.count;
  const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
  // Slice s is packs [s * slice, min((s + 1) * slice, packs)); in every slot, the pushed inputs
  // take packs [0, slice) and the sums [slice, 2 * slice) (lamport_two_shot_slot_bytes).
  const std::int64_t slice = (packs + R - 1) / R;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t slot_bytes = p.layout.lamport_slot_bytes;
  const std::int64_t own_slot = static_cast<std::int64_t>(p.rank) * slot_bytes;
  const T* in = static_cast<const T*>(p.input);
  const bool in_aligned = is_aligned16(in);
  const LamportFrame f = lamport_frame(p);
  // A failed rank gives up at once (NOTE [bounded waits]): it pushes nothing, waits for nothing
  // and poisons its outputs in `lamport_end` (with a row epilogue, after the row step, whose
  // groups of blocks meet in every row: NOTE [row groups]).
  if (!f.failed) {
    lamport_push_header<R>(p, f);
    // Scatter: slice s of this rank's input to slot `rank` of rank s. A thread reads its packs
    // of `kBatch` slices before it pushes any of them: a push is ordered before every later load
    // (the volatile store), so reading each pack just before its push made R round trips to
    // memory (a batch of all R spills at 7 and 8 ranks).
    constexpr int kBatch = R < 4 ? R : 4;
#pragma unroll 1
    for (std::int64_t i = first; i < slice; i += stride) {
#pragma unroll
      for (int s0 = 0; s0 < R; s0 += kBatch) {
        uint4 x[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (const std::int64_t v = (s0 + b) * slice + i; s0 + b < R && v < packs)
            x[b] = lamport_outgoing(Epilogue::template input<T>(p, in, v, in_aligned).raw);
#pragma unroll
        for (int b = 0; b < kBatch; ++b)
          if (s0 + b < R && (s0 + b) * slice + i < packs)
            st_volatile(lamport_buffer(p, s0 + b, f.buffer) + own_slot + i * 16, x[b]);
      }
    }
    lamport_refill<R>(p, f);
  }
  LamportHeader<R> header(p, f);  // NOTE [fingerprints]
  const char* mine = lamport_buffer(p, p.rank, f.buffer);

  // NOTE [scattered rows]
  // The reduce-scatter form of a fused call (`p.scattered`: the sequence-parallel fused norm)
  // ends where its slice is reduced. Its slices are whole rows (rank r's are rows
  // [r, r + 1) * rows / R, starting on a pack boundary: `launch_all_reduce` checks), so the owner
  // of a slice finishes its rows with the row step itself, from the sums of the packs it polls,
  // into outputs that hold its rows alone, and shares nothing: no second push, no gather, half
  // the bytes of the all-reduce form, and only the slice area of each slot to refill. The row
  // step and its launch shape are the all-reduce form's over this rank's rows, so each row's
  // result is bitwise the same as there.
  if constexpr (Epilogue::kRows) {
    if (p.scattered) {
      const std::int64_t own = slice * Pack<T>::kElems;  // this rank's elements
      const Epilogue own_rows(p.fusion, own);
      const std::uint32_t seen = header.load();
      const bool live = !f.failed;
      const bool ok = finish_rows<T, /*kBareSums=*/true>(
          own_rows, static_cast<T*>(p.output), own, p.early_launch,
          [&](std::int64_t v, Pack<T>& x) {
            Pack<T> got[R];
            NoHeader none;
            if (!live || !lamport_poll<T, R>(mine, slot_bytes, v * 16, got, none, f.wait))
              return false;
            x = sum_packs<T, R>(got);
            return true;
          });
      header.see(seen);
      lamport_end<T, R>(p, f, ok, slice * 16, header);
      return;
    }
  }

  // Reduce this rank's slice in rank order, finish it with the epilogue, and push each result to
  // slot `rank` of every rank.
  const Epilogue epilogue(p);
  bool ok = !f.failed;
  NoHeader none;
#pragma unroll 1
  for (std::int64_t i = first; i < slice && ok; i += stride) {
    if (p.rank * slice + i >= packs) break;
    Pack<T> got[R];
    ok = lamport_poll<T, R>(mine, slot_bytes, i * 16, got, none, f.wait);
    if (!ok) break;
    const std::int64_t v = p.rank * slice + i;
    const uint4 sum = lamport_outgoing(epilogue(sum_packs<T, R>(got), v * Pack<T>::kElems).raw);
#pragma unroll
    for (int r = 0; r < R; ++r)
      st_volatile(lamport_buffer(p, r, f.buffer) + own_slot + (slice + i) * 16, sum);
  }

  // The peers pushed their headers before the data the reduce just took: loaded now, the load
  // travels while the gather waits for the peers' sums, and takes no register from the polls
  // (at 7 and 8 ranks they have none to spare) (NOTE [fingerprints]).
  const std::uint32_t seen = header.load();

  // Gather: every slice's sum, from the slot of the rank that owns it; whole rows at a time for
  // an epilogue that needs them (every rank finishes every row alike).
  T* out = static_cast<T*>(p.output);
  const bool out_aligned = is_aligned16(out);
  if constexpr (Epilogue::kRows) {
    // A block whose reduce gave up does not wait again, but goes through the row step with the
    // rest of its group (NOTE [row groups]).
    const bool reduced = __syncthreads_and(ok) != 0;
    ok = finish_rows<T, /*kBareSums=*/false>(
        epilogue, out, count, p.early_launch, [&](std::int64_t v, Pack<T>& x) {
          const int s = static_cast<int>(v / slice);
          return reduced && lamport_poll_one(mine + s * slot_bytes + (slice + v - s * slice) * 16,
                                             x, f.wait, s);
        });
  } else {
#pragma unroll 1
    for (std::int64_t i = first; i < slice && ok; i += stride) {
      // Slices past the end of a short last slice were never pushed.
      int slots = 0;
#pragma unroll
      for (int s = 0; s < R; ++s) slots += s * slice + i < packs ? 1 : 0;
      Pack<T> sums[R];
      ok = lamport_poll<T, R>(mine, slot_bytes, (slice + i) * 16, sums, none, f.wait, slots);
      if (!ok) break;
#pragma unroll
      for (int s = 0; s < R; ++s)
        if (s < slots) store_pack(out, s * slice + i, count, out_aligned, sums[s]);
    }
    if (ok && p.early_launch) allow_next_launch();  // NOTE [programmatic launch]
  }
  header.see(seen);
  lamport_end<T, R>(p, f, ok, 2 * slice * 16, header);
}

}  // namespace tpcomm::kernels
