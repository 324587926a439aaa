// SPDX-License-Identifier: Apache-2.0
// The epilogue slot of the all-reduce kernels, and the epilogues: the identity (plain
// all-reduce) and the fused residual add + RMSNorm (+ FP8 quantisation), with the prologue of the
// MoE combine.
#pragma once

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common/combine.hpp"
#include "kernels/common/sync.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

// NOTE [epilogues]
// Every all-reduce kernel is a template over an epilogue, which sees each reduced pack before it
// is stored (one-shot and Lamport: before the output store; two-shots: where the owner of a
// slice finishes it, before it is shared) and returns what to store. This is how fused
// operations (residual add, RMSNorm, quantisation) ride on the same kernels instead of copies of
// them. An epilogue is a trivially copyable type constructed on the device from the kernel's
// `AllReduceParams` (where its own arguments live, in `fusion`), with
//
//   template <class T>
//   __device__ Pack<T> operator()(const Pack<T>& sum, std::int64_t first) const;
//
// where `first` is the index in the message of the pack's first element, and constants `kRows`
// and `kMaxThreads` (the kernel's launch bound). It also gives the kernel this rank's input
// packs, `input<T>(params, in, v, aligned)`: the prologue slot, where the Lamport kernels read
// what they push. Most read it from `in`; the MoE finalize's (`FusionTraits::combine`) computes
// each pack of the rank's combine there (`combine_pack`, kernels/common/combine.hpp), and the
// combine is never stored. An epilogue with `kRows` also needs whole rows: the kernel then ends
// with `finish_rows` instead of storing packs as they come, one block per row (the packs a kernel
// pushes and polls stay those of the flat message, so nothing else changes). What an epilogue does
// is fixed at compile time by `FusionTraits` (kernels/kernels.hpp): residual add in the pack step,
// the norm (`RowNorm` of its kind) and quantisation in the row step. `Identity` stores the sum as
// it is and compiles to nothing: the kernels with it are the plain all-reduce (measured before and
// after in docs/PERFORMANCE.md).
struct Identity {
  static constexpr bool kRows = false;
  static constexpr int kMaxThreads = kLamportMaxThreads;  // only Lamport kernels read it

  __device__ explicit Identity(const AllReduceParams& /*params*/) {}

  /// Pack `v` of this rank's input (the prologue slot: NOTE [epilogues]).
  template <class T>
  __device__ __forceinline__ static Pack<T> input(const AllReduceParams& p, const T* in,
                                                  std::int64_t v, bool in_aligned) {
    return load_pack(in, v, p.count, in_aligned);
  }

  template <class T>
  __device__ __forceinline__ Pack<T> operator()(const Pack<T>& sum, std::int64_t /*first*/) const {
    return sum;
  }
};

/// The fused epilogue `K` (named by its `Fusion`, since a kernel's template arguments cannot be
/// class values), whose traits `F` decide: with `F.residual`, the pack step adds the residual when
/// the call gives one (in fp32, one rounding); with a norm (`F.norm`), the row step stores each
/// row (`residual_out`) and then its normalisation (`RowNorm`, times gamma or `1 + gamma`), with
/// the row's statistic in fp32 over the stored (rounded) row, in `F.quant`'s format.
template <Fusion K>
struct Fused {
  static constexpr FusionTraits F = traits(K);
  static constexpr bool kRows = F.rows();
  static constexpr int kMaxThreads = kFusedMaxThreads;

  FusionParams f;
  std::int64_t count;
  bool residual_aligned;

  __device__ explicit Fused(const AllReduceParams& p) : Fused(p.fusion, p.count) {}
  __device__ Fused(const FusionParams& fusion, std::int64_t elements)
      : f(fusion), count(elements), residual_aligned(is_aligned16(fusion.residual)) {}

  /// Pack `v` of this rank's input: read from `in`, or with `F.combine` combined from its
  /// experts' outputs (`combine_pack`).
  template <class T>
  __device__ __forceinline__ static Pack<T> input(const AllReduceParams& p, const T* in,
                                                  std::int64_t v, bool in_aligned) {
    if constexpr (F.combine)
      return combine_pack<T>(p.fusion.moe, v, p.count);
    else
      return load_pack(in, v, p.count, in_aligned);
  }

  template <class T>
  __device__ __forceinline__ Pack<T> operator()(const Pack<T>& sum, std::int64_t first) const {
    return add(sum, residual_pack<T>(first / Pack<T>::kElems));
  }

  /// Pack `v` of the residual (zeros without one): loaded apart from `add` so that a kernel can
  /// issue the load before it waits for the sum.
  template <class T>
  __device__ __forceinline__ Pack<T> residual_pack(std::int64_t v) const {
    if constexpr (F.residual) {
      if (f.residual != nullptr)
        return load_pack(static_cast<const T*>(f.residual), v, count, residual_aligned);
    }
    return Pack<T>{};
  }

  /// `sum + residual` in fp32, rounded once; `sum` itself without a residual.
  template <class T>
  __device__ __forceinline__ Pack<T> add(const Pack<T>& sum, const Pack<T>& residual) const {
    if constexpr (F.residual) {
      if (f.residual == nullptr) return sum;
      Pack<T> out;
#pragma unroll
      for (int i = 0; i < Pack<T>::kElems; ++i)
        out[i] = from_float<T>(to_float(sum[i]) + to_float(residual[i]));
      return out;
    } else {
      return sum;
    }
  }
};

/// The arithmetic of a norm kind (`Norm`) in the row step of `finish_rows`: each element's term
/// of the row's statistic (summed over the row in fp32), the row's factor from that sum, and an
/// element normalised by the factor and its weight (gamma, or `1 + gamma`). A new norm is its
/// `Norm` value, a specialisation here and a traits row (kernels/kernels.hpp).
template <Norm N>
struct RowNorm;

/// RMSNorm: `x * rsqrt(mean(x^2) + eps) * w`.
template <>
struct RowNorm<Norm::kRms> {
  __device__ __forceinline__ static float term(float x) { return x * x; }
  __device__ __forceinline__ static float factor(float sum, std::int64_t hidden, float eps) {
    return rsqrtf(sum / static_cast<float>(hidden) + eps);
  }
  __device__ __forceinline__ static float apply(float x, float factor, float w) {
    return x * factor * w;
  }
};

/// `op` over the block of `x` (0 is the identity: sums, and maxima of non-negative values),
/// returned to every thread, and whether `ok` holds in every thread of the block (the result in
/// `ok`). Every thread of the block calls it; blockDim.x is a multiple of 32. One barrier: each
/// warp reduces its lanes, publishes the result, and every warp then reduces the published ones
/// itself, in one order fixed by the block size, so equal inputs give bitwise equal results.
/// Consecutive calls with the same `Op` alternate `slot` (0, 1): a warp that runs a call ahead
/// publishes into the other slot, and one two calls ahead has passed a barrier that every warp
/// reached after reading.
template <class Op>
__device__ __forceinline__ float block_reduce(float x, bool& ok, unsigned slot, Op op) {
  __shared__ float2 partial[2][32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  const bool warp_ok = __all_sync(0xFFFFFFFFu, ok) != 0;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[slot][warp] = make_float2(x, warp_ok ? 1.f : 0.f);
  __syncthreads();
  const float2 v = lane < blockDim.x / 32 ? partial[slot][lane] : make_float2(0.f, 1.f);
  x = v.x;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  ok = __all_sync(0xFFFFFFFFu, v.y != 0.f) != 0;
  return x;
}

// NOTE [row groups]
// The row step spreads a row over a group of blocks, so that a decode batch of a few rows keeps
// as many blocks busy as a plain all-reduce of the same bytes, each thread holding one or two
// packs of its row instead of a whole block's worth. The group is the thread-block cluster the
// kernel was launched with (`LaunchShape::group`; without one it is the block alone, as in the
// standalone add + RMSNorm kernel). The first rows x group blocks finish the rows; a grid may
// have more (whole groups), which push their share of the message (`spread_first` in
// kernels/common/lamport.cuh), refill the previous buffer in place of the row blocks, and end:
// a few rows then do not leave a small message's stores to a few SMs, and the row blocks go
// from their pushes straight to their polls (`fused_launch` in src/tune/selector.cpp). Block k of a
// group takes packs k * blockDim.x + t, k * blockDim.x + t + group size * blockDim.x, ... of the
// row. The group's blocks combine their partial sums by pushing: thread b of every block stores
// the block's partial into block b's shared memory, one cluster barrier makes them visible, and
// every block adds the partials it received in the same order (block 0 first), so every block,
// and every rank, gets bitwise the same result. One barrier per combine, and none at the end: no
// block reads another's shared memory, and the last remote store precedes the last barrier, so a
// block may return while others still read their own. Two slots alternate, so a block that is a
// combine ahead never overwrites what another still reads. A block's first remote store waits for
// the cluster to have started (an arrival made when the group is formed, long since complete then).

/// The group of blocks that shares a row (NOTE [row groups]).
struct RowGroup {
  unsigned size;      // blocks in the group
  unsigned rank;      // this block's place in it
  unsigned combines;  // combines done so far: picks the slot

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // Before Hopper there are no clusters (the host launches none there): the block alone.
  __device__ __forceinline__ RowGroup() : size(1), rank(0), combines(0) {}
#else
  __device__ __forceinline__ RowGroup()
      : size(cooperative_groups::this_cluster().num_blocks()),
        rank(cooperative_groups::this_cluster().block_rank()),
        combines(0) {
    if (size > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
#endif

  /// `op` over the group of every block's `x` (each already reduced over its block), and
  /// whether `ok` holds in every block; every thread of every block of the group calls it.
  template <class Op>
  __device__ __forceinline__ float combine(float x, bool& ok, Op op) {
    if (size == 1) return x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    return x;
#else
    __shared__ float2 slot[2][kMaxRowGroup];
    const unsigned s = combines & 1u;
    // Every block of the cluster has started (the arrival made when the group was formed).
    if (combines++ == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (threadIdx.x < size)
      *cooperative_groups::this_cluster().map_shared_rank(&slot[s][rank], threadIdx.x) =
          make_float2(x, ok ? 1.f : 0.f);
    cooperative_groups::this_cluster().sync();
    float all = 0.f;
    bool every = true;
    for (unsigned b = 0; b < size; ++b) {
      const float2 v = slot[s][b];
      all = b == 0 ? v.x : op(all, v.x);
      every = every && v.y != 0.f;
    }
    ok = every;
    return all;
#endif
  }

  /// Before the block returns: a group formed but never combined completes its first barrier.
  __device__ __forceinline__ void finish() const {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    if (size > 1 && combines == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
  }
};

/// True for element `i` of pack `v` (of W elements) when it lies in [lo, hi).
template <int W>
__device__ __forceinline__ bool in_row(std::int64_t v, int i, std::int64_t lo, std::int64_t hi) {
  const std::int64_t e = v * W + i;
  return e >= lo && e < hi;
}

/// Stores the elements of pack `v` that lie in [lo, hi) (whole packs at once where aligned).
template <class T>
__device__ __forceinline__ void store_in_row(T* p, std::int64_t v, std::int64_t lo, std::int64_t hi,
                                             bool aligned, const Pack<T>& x) {
  constexpr int W = Pack<T>::kElems;
  if (aligned && v * W >= lo && v * W + W <= hi) {
    *reinterpret_cast<uint4*>(p + v * W) = x.raw;
    return;
  }
#pragma unroll
  for (int i = 0; i < W; ++i)
    if (in_row<W>(v, i, lo, hi)) p[v * W + i] = x[i];
}

/// The same for W f8e4m3 bytes (one per element of a pack of T).
template <class T>
__device__ __forceinline__ void store_in_row_fp8(std::uint8_t* p, std::int64_t v, std::int64_t lo,
                                                 std::int64_t hi,
                                                 const std::uint8_t (&q)[16 / sizeof(T)]) {
  constexpr int W = Pack<T>::kElems;
  std::uint8_t* at = p + v * W;
  if (v * W >= lo && v * W + W <= hi && (reinterpret_cast<std::uintptr_t>(at) % W) == 0) {
    if constexpr (W == 8) {
      uint2 w;
      memcpy(&w, q, 8);
      *reinterpret_cast<uint2*>(at) = w;
    } else {
      std::uint32_t w;
      memcpy(&w, q, 4);
      *reinterpret_cast<std::uint32_t*>(at) = w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < W; ++i)
    if (in_row<W>(v, i, lo, hi)) at[i] = q[i];
}

/// Gamma for the elements of pack `v` of the row [lo, lo + hidden): one load where the row
/// starts on a pack boundary, element by element otherwise; 0 outside the row.
template <class T>
__device__ __forceinline__ Pack<T> gamma_for(const T* gamma, bool gamma_aligned, std::int64_t v,
                                             std::int64_t lo, std::int64_t hidden) {
  constexpr int W = Pack<T>::kElems;
  if (lo % W == 0) return load_pack(gamma, v - lo / W, hidden, gamma_aligned);
  Pack<T> g;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const std::int64_t j = v * W + i - lo;
    g[i] = j >= 0 && j < hidden ? gamma[j] : from_float<T>(0.f);
  }
  return g;
}

/// The factors of the elements of pack `v` of the row [lo, lo + hidden) in fp32: `g`, gamma's
/// pack loaded before, or an f32 gamma (`f.gamma_f32`) loaded here; plus one in Gemma's form.
/// Outside the row they are not used.
template <class T>
__device__ __forceinline__ void weights(const FusionParams& f, const Pack<T>& g, std::int64_t v,
                                        std::int64_t lo, std::int64_t hidden,
                                        float (&w)[Pack<T>::kElems]) {
  constexpr int W = Pack<T>::kElems;
  if constexpr (sizeof(T) == 2) {
    if (f.gamma_f32) {
      const auto* gamma = static_cast<const float*>(f.gamma);
      const std::int64_t j0 = v * W - lo;
      if (j0 >= 0 && j0 + W <= hidden && is_aligned16(gamma + j0)) {
#pragma unroll
        for (int i = 0; i < W; i += 4) {
          const float4 q = *reinterpret_cast<const float4*>(gamma + j0 + i);
          w[i] = q.x, w[i + 1] = q.y, w[i + 2] = q.z, w[i + 3] = q.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < W; ++i) w[i] = j0 + i >= 0 && j0 + i < hidden ? gamma[j0 + i] : 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) w[i] = to_float(g[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = to_float(g[i]);
  }
  if (f.gamma_plus_one) {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] += 1.f;
  }
}

/// The row step of an epilogue with `kRows` (NOTE [epilogues]) over the `count` elements of the
/// message, as rows of `e.f.hidden`: row group g (NOTE [row groups]) takes rows g, g + the number
/// of groups, ... . `fetch(v, x)`
/// gives flat pack v (false: a wait gave up): the bare sum with `kBareSums` (the pack step is
/// applied here, its residual and gamma loaded before the wait), else with the pack step
/// applied. Each row is stored
/// into `out` (residual_out), its statistic (`RowNorm<F.norm>`) reduced over the group, and its
/// normalisation stored into `e.f.norm_out`. A thread keeps its first packs of a row in registers
/// and reads the rest back from `out`, which it wrote itself. With `early_launch`, the next kernel
/// may be scheduled once the block's last row is fetched (NOTE [programmatic launch]). Returns
/// false, on every thread of every block of the group, when a fetch failed in any of them.
template <class T, bool kBareSums, Fusion K, class Fetch>
__device__ __forceinline__ bool finish_rows(const Fused<K>& e, T* out, std::int64_t count,
                                            bool early_launch, Fetch&& fetch) {
  constexpr FusionTraits F = traits(K);
  using N = RowNorm<F.norm>;
  constexpr int W = Pack<T>::kElems;
  constexpr int kKept = 2;
  constexpr float kFp8Max = 448.f;
  const std::int64_t hidden = e.f.hidden;
  const std::int64_t rows = count / hidden;
  const bool out_aligned = is_aligned16(out);
  // A gamma of T is loaded with the sums; an f32 one (`weights`) when it is used.
  const T* gamma = e.f.gamma_f32 && sizeof(T) == 2 ? nullptr : static_cast<const T*>(e.f.gamma);
  const bool gamma_aligned = is_aligned16(gamma);
  const auto sum = [](float a, float b) { return a + b; };
  const auto max = [](float a, float b) { return fmaxf(a, b); };
  RowGroup group;
  // The first `row_blocks` blocks finish the rows; the rest of the grid only pushed (NOTE [row
  // groups]).
  const auto row_blocks = static_cast<unsigned>(
      min(static_cast<std::int64_t>(gridDim.x), rows * static_cast<std::int64_t>(group.size)));
  const unsigned groups = row_blocks / group.size;
  // This thread's first pack of a row, and the distance to its next (NOTE [row groups]).
  const std::int64_t lane = static_cast<std::int64_t>(group.rank) * blockDim.x + threadIdx.x;
  const std::int64_t step = static_cast<std::int64_t>(group.size) * blockDim.x;
  unsigned slot = 0;  // block_reduce's, alternating by row
  for (std::int64_t row = blockIdx.x < row_blocks ? blockIdx.x / group.size : rows; row < rows;
       row += groups, slot ^= 1u) {
    const std::int64_t lo = row * hidden, hi = lo + hidden;
    const std::int64_t v0 = lo / W, v1 = (hi + W - 1) / W;
    Pack<T> kept[kKept], gammas[kKept]{};
    float terms = 0.f;  // the row's statistic (N::term summed)
    bool ok = true;
    // Stores pack v of the row and adds its terms.
    auto keep = [&](std::int64_t v, const Pack<T>& x) {
      store_in_row(out, v, lo, hi, out_aligned, x);
#pragma unroll
      for (int i = 0; i < W; ++i)
        if (in_row<W>(v, i, lo, hi)) terms += N::term(to_float(x[i]));
    };
    {
      // What does not depend on the sum is loaded first.
      Pack<T> residuals[kKept];
#pragma unroll
      for (int k = 0; k < kKept; ++k) {
        const std::int64_t v = v0 + lane + k * step;
        if (v < v1) {
          if (gamma != nullptr) gammas[k] = gamma_for(gamma, gamma_aligned, v, lo, hidden);
          if constexpr (kBareSums) residuals[k] = e.template residual_pack<T>(v);
        }
      }
#pragma unroll
      for (int k = 0; k < kKept; ++k) {
        const std::int64_t v = v0 + lane + k * step;
        if (ok && v < v1) {
          ok = fetch(v, kept[k]);
          if constexpr (kBareSums) kept[k] = e.add(kept[k], residuals[k]);
          if (ok) keep(v, kept[k]);
        }
      }
    }
    for (std::int64_t v = v0 + lane + kKept * step; ok && v < v1; v += step) {
      Pack<T> x;
      ok = fetch(v, x);
      if constexpr (kBareSums) x = e(x, v * W);
      if (ok) keep(v, x);
    }
    const float total = group.combine(block_reduce(terms, ok, slot, sum), ok, sum);
    // The block's last row: no wait is left, only the norm (NOTE [programmatic launch]).
    if (ok && early_launch && row + groups >= rows) allow_next_launch();
    if (!ok) {
      group.finish();
      return false;
    }
    const float factor = N::factor(total, hidden, e.f.eps);

    // The normalised pack (`x` holds the stored row values, `g` gamma of T where it is that).
    auto normalised = [&](const Pack<T>& x, const Pack<T>& g, std::int64_t v, float(&y)[W]) {
      float w[W];
      weights(e.f, g, v, lo, hidden, w);
#pragma unroll
      for (int i = 0; i < W; ++i) y[i] = N::apply(to_float(x[i]), factor, w[i]);
    };
    // Calls `each(v, y)` for every pack of the row this thread holds, in order.
    auto for_each_pack = [&](auto&& each) {
#pragma unroll
      for (int k = 0; k < kKept; ++k) {
        const std::int64_t v = v0 + lane + k * step;
        if (v < v1) {
          float y[W];
          normalised(kept[k], gammas[k], v, y);
          each(v, y);
        }
      }
      for (std::int64_t v = v0 + lane + kKept * step; v < v1; v += step) {
        float y[W];
        normalised(load_pack(out, v, count, out_aligned),
                   gamma != nullptr ? gamma_for(gamma, gamma_aligned, v, lo, hidden) : Pack<T>{}, v,
                   y);
        each(v, y);
      }
    };

    // Stores `y * inverse` in f8e4m3.
    auto store_fp8 = [&](std::int64_t v, const float(&y)[W], float inverse) {
      std::uint8_t q[W];
#pragma unroll
      for (int i = 0; i < W; ++i)
        q[i] = __nv_cvt_float_to_fp8(y[i] * inverse, __NV_SATFINITE, __NV_E4M3);
      store_in_row_fp8<T>(static_cast<std::uint8_t*>(e.f.norm_out), v, lo, hi, q);
    };
    if constexpr (F.quant == Quant::kNone) {
      T* norm = static_cast<T*>(e.f.norm_out);
      const bool norm_aligned = is_aligned16(norm);
      for_each_pack([&](std::int64_t v, const float(&y)[W]) {
        Pack<T> n;
#pragma unroll
        for (int i = 0; i < W; ++i) n[i] = from_float<T>(y[i]);
        store_in_row(norm, v, lo, hi, norm_aligned, n);
      });
    } else if constexpr (F.quant == Quant::kFp8Group) {
      // A group's packs are held by kLanes consecutive lanes of one warp (the row starts on a
      // pack boundary and blockDim.x is a multiple of 32), all in the row or all past it: its
      // maximum is theirs, shuffled among them.
      constexpr int kLanes = kFp8Group / W;
      const unsigned lanes = kLanes == 32 ? 0xFFFFFFFFu : 0xFFFFu << (threadIdx.x & 16u);
      for_each_pack([&](std::int64_t v, const float(&y)[W]) {
        float amax = 0.f;
#pragma unroll
        for (int i = 0; i < W; ++i) amax = fmaxf(amax, fabsf(y[i]));
#pragma unroll
        for (int o = kLanes / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(lanes, amax, o));
        const float scale = fmaxf(amax / kFp8Max, 1.f / (kFp8Max * 512.f));
        // Rows start on a group boundary: the group's first lane writes its scale.
        if (v * W % kFp8Group == 0) e.f.row_scales[v * W / kFp8Group] = scale;
        store_fp8(v, y, 1.f / scale);
      });
    } else {
      float inverse = 0.f;
      if constexpr (F.quant == Quant::kFp8) {
        inverse = 1.f / *e.f.scale;
      } else {
        float amax = 0.f;
        for_each_pack([&](std::int64_t v, const float(&y)[W]) {
#pragma unroll
          for (int i = 0; i < W; ++i)
            if (in_row<W>(v, i, lo, hi)) amax = fmaxf(amax, fabsf(y[i]));
        });
        // vLLM's floor keeps an all-zero row finite.
        bool all = true;
        const float scale =
            fmaxf(group.combine(block_reduce(amax, all, slot, max), all, max) / kFp8Max,
                  1.f / (kFp8Max * 512.f));
        if (threadIdx.x == 0 && group.rank == 0) e.f.row_scales[row] = scale;
        inverse = 1.f / scale;
      }
      for_each_pack([&](std::int64_t v, const float(&y)[W]) { store_fp8(v, y, inverse); });
    }
  }
  group.finish();
  return true;
}

}  // namespace tpcomm::kernels
