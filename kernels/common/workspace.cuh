// SPDX-License-Identifier: Apache-2.0
// Finding things in the ranks' workspaces: the prologue every all-reduce kernel shares.
#pragma once

#include <cstdint>

#include "kernels/common/poison.cuh"
#include "kernels/common/sync.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

/// What one launch of an all-reduce kernel resolved at its start.
template <class T, int R>
struct AllReduceFrame {
  const T* src[R];    // where rank r's input is read from (registered buffer or staging)
  T* staging_self;    // this rank's staging half of this operation
  std::uint32_t seq;  // this operation's number (NOTE [signal pad])
  bool stage_self;    // this rank copies its input into `staging_self` first
  bool failed;        // this rank has failed: give up at once (NOTE [bounded waits])
  WaitContext wait;

  __device__ std::uint32_t barrier_value(std::uint32_t phase) const {
    return seq * SignalPad::kPhases + phase;
  }
};

template <class T>
__device__ __forceinline__ T* staging_half(const AllReduceParams& p, int rank, std::uint32_t seq) {
  return reinterpret_cast<T*>(p.workspaces[rank] + p.layout.staging +
                              static_cast<std::int64_t>(seq & 1u) * p.layout.half_bytes);
}

template <class T>
__device__ __forceinline__ T* scratch_of(const AllReduceParams& p, int rank) {
  return reinterpret_cast<T*>(p.workspaces[rank] + p.layout.scratch);
}

/// Reads the operation number and the input pointers. Every thread calls it, after
/// `begin_launch`.
template <class T, int R>
__device__ __forceinline__ AllReduceFrame<T, R> make_frame(const AllReduceParams& p) {
  __shared__ std::uint32_t seq_shared, failed_shared;
  AllReduceFrame<T, R> f;
  f.wait = wait_context(p);
  if (threadIdx.x == 0) {
    SignalPad* self = p.pads[p.rank];
    const OperationStart start = start_operation(self, self->seq, p.fingerprint, p.call);
    seq_shared = start.seq;
    failed_shared = start.failed;
  }
  // Issued before the block waits for the count, so that both loads are in flight together.
  // Every index is a constant after unrolling, so `in` and `src` stay in registers.
  const void* in[R];
#pragma unroll
  for (int r = 0; r < R; ++r) in[r] = p.registered != nullptr ? p.registered->ptr[r] : nullptr;
  // Read again rather than taken from `in[p.rank]`: a run-time index would move `in` to local
  // memory.
  f.stage_self = p.registered == nullptr || p.registered->ptr[p.rank] == nullptr;
  __syncthreads();
  f.seq = seq_shared;
  f.failed = failed_shared != 0;
#pragma unroll
  for (int r = 0; r < R; ++r)
    f.src[r] = in[r] != nullptr ? static_cast<const T*>(in[r]) : staging_half<T>(p, r, f.seq);
  f.staging_self = staging_half<T>(p, p.rank, f.seq);
  return f;
}

/// Sum of `in[0..R-1]` in that order, accumulated in fp32. The same order on every rank and in
/// every algorithm, so all outputs are bitwise identical.
template <class T, int R>
__device__ __forceinline__ Pack<T> sum_packs(const Pack<T> (&in)[R]) {
  constexpr int W = Pack<T>::kElems;
  float acc[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc[i] = to_float(in[0][i]);
#pragma unroll
  for (int r = 1; r < R; ++r)
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] += to_float(in[r][i]);
  Pack<T> out;
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = from_float<T>(acc[i]);
  return out;
}

/// Sum of pack `v` over ranks 0..R-1 (`sum_packs`).
template <class T, int R>
__device__ __forceinline__ Pack<T> reduce_pack(const T* const* src, std::int64_t v,
                                               std::int64_t count, bool src_aligned) {
  Pack<T> in[R];
#pragma unroll
  for (int r = 0; r < R; ++r) in[r] = load_pack(src[r], v, count, src_aligned);
  return sum_packs<T, R>(in);
}

template <class T, int R>
__device__ __forceinline__ bool all_aligned(const T* const* src) {
  bool ok = true;
#pragma unroll
  for (int r = 0; r < R; ++r) ok = ok && is_aligned16(src[r]);
  return ok;
}

}  // namespace tpcomm::kernels
