// SPDX-License-Identifier: Apache-2.0
// One-shot all-reduce (pull): after one barrier every rank reads every rank's whole input and
// writes the whole sum. One barrier, R x n bytes read per rank: the small-message algorithm.
#pragma once

#include "kernels/common/epilogue.cuh"
#include "kernels/common/workspace.cuh"

namespace tpcomm::kernels {

template <class T, int R, class Epilogue>
__global__ void __launch_bounds__(1024, 1) all_reduce_one_shot_kernel(AllReduceParams p) {
  begin_launch();
  if (p.count == 0) return;  // a warm-up launch: nothing to do (NOTE [first launch])
  const std::int64_t count = p.count;
  const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const T* in = static_cast<const T*>(p.input);
  const bool in_aligned = is_aligned16(in);
  // A staged input's first pack is loaded while the frame reads the operation count.
  const bool prefetch = p.registered == nullptr && first < packs;
  Pack<T> head{};
  if (prefetch) head = load_pack(in, first, count, in_aligned);
  const AllReduceFrame<T, R> f = make_frame<T, R>(p);
  // False from where the block gave up (NOTE [bounded waits]); the same in every thread, and
  // one place that poisons the outputs at the end (each would be inlined).
  bool ok = !f.failed;

  // Stage this rank's input (NOTE [staging]). Block b copies exactly the packs that block b of
  // every rank reads below, so block b's barrier is all the ordering they need.
  if (ok && f.stage_self) {
    std::int64_t v = first;
    if (prefetch) {
      store_pack_ws(f.staging_self, v, head);
      v += stride;
    }
    for (; v < packs; v += stride)
      store_pack_ws(f.staging_self, v, load_pack(in, v, count, in_aligned));
  }
  ok = ok && barrier_block<R>(p.pads, p.rank, f.barrier_value(1), p.fingerprint, f.wait);

  if (ok) {
    if (!p.end_barrier && p.early_launch) allow_next_launch();
    T* out = static_cast<T*>(p.output);
    const bool out_aligned = is_aligned16(out);
    const bool src_aligned = all_aligned<T, R>(f.src);
    const Epilogue epilogue(p);
    for (std::int64_t v = first; v < packs; v += stride)
      store_pack(out, v, count, out_aligned,
                 epilogue(reduce_pack<T, R>(f.src, v, count, src_aligned), v * Pack<T>::kElems));
  }

  // Registered inputs belong to the caller again when this kernel ends: wait until every peer
  // has read them.
  if (ok && p.end_barrier) {
    ok = barrier_block<R>(p.pads, p.rank, f.barrier_value(3), p.fingerprint, f.wait);
    if (ok && p.early_launch) allow_next_launch();
  }
  if (!ok) return poison_outputs_block<T>(p);
  end_launch(p.pads[p.rank]->seq, f.seq);
}

}  // namespace tpcomm::kernels
