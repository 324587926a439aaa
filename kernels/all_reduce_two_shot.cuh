// SPDX-License-Identifier: Apache-2.0
// Two-shot all-reduce: reduce-scatter (rank r sums slice r of every rank into its scratch),
// barrier, all-gather (every rank copies every reduced slice). About 2n bytes moved per rank:
// the medium- and large-message algorithm.
#pragma once

#include "kernels/common/epilogue.cuh"
#include "kernels/common/workspace.cuh"

namespace tpcomm::kernels {

template <class T, int R, class Epilogue>
__global__ void __launch_bounds__(1024, 1) all_reduce_two_shot_kernel(AllReduceParams p) {
  begin_launch();
  if (p.count == 0) return;  // a warm-up launch: nothing to do (NOTE [first launch])
  const AllReduceFrame<T, R> f = make_frame<T, R>(p);
  const std::int64_t count = p.count;
  const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
  // Slice s is packs [s * slice, min((s + 1) * slice, packs)). Within every slice, block b
  // handles the same offsets, so block b of each rank touches exactly what block b of its
  // peers produced: per-block barriers suffice.
  const std::int64_t slice = (packs + R - 1) / R;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  // False from where the block gave up (NOTE [bounded waits]); the same in every thread, and
  // one place that poisons the outputs at the end (each would be inlined).
  bool ok = !f.failed;

  if (ok && f.stage_self) {
    const T* in = static_cast<const T*>(p.input);
    const bool in_aligned = is_aligned16(in);
#pragma unroll 1
    for (int s = 0; s < R; ++s)
      for (std::int64_t i = first; i < slice; i += stride)
        if (const std::int64_t v = s * slice + i; v < packs)
          store_pack_ws(f.staging_self, v, load_pack(in, v, count, in_aligned));
  }
  ok = ok && barrier_block<R>(p.pads, p.rank, f.barrier_value(1), p.fingerprint, f.wait);

  // Reduce-scatter: this rank's slice, summed in rank order (bitwise the same as one-shot) and
  // finished by the epilogue before it is shared.
  if (ok) {
    T* scratch_self = scratch_of<T>(p, p.rank);
    const bool src_aligned = all_aligned<T, R>(f.src);
    const Epilogue epilogue(p);
    for (std::int64_t i = first; i < slice; i += stride)
      if (const std::int64_t v = p.rank * slice + i; v < packs)
        store_pack_ws(
            scratch_self, v,
            epilogue(reduce_pack<T, R>(f.src, v, count, src_aligned), v * Pack<T>::kElems));
  }
  ok = ok && barrier_block<R>(p.pads, p.rank, f.barrier_value(2), p.fingerprint, f.wait);

  // All-gather: every reduced slice from its owner's scratch.
  if (ok) {
    if (!p.end_barrier && p.early_launch) allow_next_launch();
    T* out = static_cast<T*>(p.output);
    const bool out_aligned = is_aligned16(out);
    for (std::int64_t i = first; i < slice; i += stride) {
      Pack<T> parts[R];
#pragma unroll
      for (int s = 0; s < R; ++s)
        if (const std::int64_t v = s * slice + i; v < packs)
          parts[s] = load_pack_ws(scratch_of<T>(p, s), v);
#pragma unroll
      for (int s = 0; s < R; ++s)
        if (const std::int64_t v = s * slice + i; v < packs)
          store_pack(out, v, count, out_aligned, parts[s]);
    }
  }

  // The next operation's reduce-scatter overwrites scratch only after its start barrier, so
  // only registered inputs need the end barrier (NOTE [staging]).
  if (ok && p.end_barrier) {
    ok = barrier_block<R>(p.pads, p.rank, f.barrier_value(3), p.fingerprint, f.wait);
    if (ok && p.early_launch) allow_next_launch();
  }
  if (!ok) return poison_outputs_block<T>(p);
  end_launch(p.pads[p.rank]->seq, f.seq);
}

}  // namespace tpcomm::kernels
