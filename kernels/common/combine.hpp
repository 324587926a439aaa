// SPDX-License-Identifier: Apache-2.0
// The MoE combine as the Lamport kernels' prologue computes it, pack by pack (`Fused::input` in
// kernels/common/epilogue.cuh): host code too, so that the cpu tier runs it against the combine's
// definition (NOTE [moe combine] in kernels/moe_combine.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/host_device.hpp"
#include "kernels/common/vec.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

/// The router's weight `i` (`[tokens, top_k]` flat) of a combine, in f32.
template <class T>
TPCOMM_HOST_DEVICE float moe_weight(const MoeCombineParams& m, std::int64_t i) {
  return m.weights_f32 ? static_cast<const float*>(m.weights)[i]
                       : to_float(static_cast<const T*>(m.weights)[i]);
}

/// Element `c` of token `t`'s row of the MoE combine in f32, as `launch_moe_combine` computes it
/// (NOTE [moe combine] in kernels/moe_combine.cu): fmaf over k ascending, then `+ shared`; NaN
/// when the token's map names a row outside the experts.
template <class T>
TPCOMM_HOST_DEVICE float combine_element(const MoeCombineParams& m, std::int64_t t,
                                         std::int64_t c) {
  const T* experts = static_cast<const T*>(m.experts);
  float acc = 0.f;
  for (int k = 0; k < m.top_k; ++k) {
    const std::int64_t i = t * m.top_k + k;
    const std::int32_t row = m.map[i];
    if (row < 0 || row >= m.rows) return NAN;
    acc = fmaf(moe_weight<T>(m, i), to_float(experts[row * m.hidden + c]), acc);
  }
  if (m.shared != nullptr) acc += to_float(static_cast<const T*>(m.shared)[t * m.hidden + c]);
  return acc;
}

/// How many of a token's experts `combine_pack` reads at once: their map entries and weights in
/// one round trip to memory, then their rows in one more (a load per expert, each waiting for
/// the last one's map entry, made the prologue a chain of top-k round trips).
inline constexpr int kCombineBatch = 8;

/// Pack `v` of a rank's MoE combine over `count` = tokens x hidden elements, rounded once into
/// T (bitwise what `launch_moe_combine` stores there); zeros past `count`. Where the rows are
/// whole packs (hidden a multiple of the pack, 16-byte aligned experts and shared), the pack lies
/// in one token's row and each expert's part of it is one load, made `kCombineBatch` experts at
/// a time; the sum's order stays k ascending, then the shared expert.
template <class T>
TPCOMM_HOST_DEVICE Pack<T> combine_pack(const MoeCombineParams& m, std::int64_t v,
                                        std::int64_t count) {
  constexpr int W = Pack<T>::kElems;
  constexpr int B = kCombineBatch;
  const std::int64_t e0 = v * W;
  Pack<T> out;
  out.raw = make_uint4(0, 0, 0, 0);
  if (e0 >= count) return out;
  const T* experts = static_cast<const T*>(m.experts);
  const T* shared = static_cast<const T*>(m.shared);
  if (m.hidden % W == 0 && e0 + W <= count && is_aligned16(experts) &&
      (shared == nullptr || is_aligned16(shared))) {
    const std::int64_t t = e0 / m.hidden, c = e0 - t * m.hidden;
    Pack<T> extra;  // the shared expert's part, loaded with the first batch
    extra.raw = make_uint4(0, 0, 0, 0);
    if (shared != nullptr) extra.raw = *reinterpret_cast<const uint4*>(shared + e0);
    float acc[W];
    TPCOMM_UNROLL
    for (int i = 0; i < W; ++i) acc[i] = 0.f;
    bool bad = false;
    for (int k0 = 0; k0 < m.top_k && !bad; k0 += B) {
      std::int32_t row[B];
      float w[B];
      TPCOMM_UNROLL
      for (int j = 0; j < B; ++j) {
        row[j] = 0;
        w[j] = 0.f;
        if (k0 + j < m.top_k) {
          const std::int64_t i = t * m.top_k + k0 + j;
          row[j] = m.map[i];
          w[j] = moe_weight<T>(m, i);
          bad = bad || row[j] < 0 || row[j] >= m.rows;
        }
      }
      if (bad) break;
      Pack<T> x[B];
      TPCOMM_UNROLL
      for (int j = 0; j < B; ++j)
        x[j].raw = k0 + j < m.top_k
                       ? *reinterpret_cast<const uint4*>(experts + row[j] * m.hidden + c)
                       : make_uint4(0, 0, 0, 0);
      TPCOMM_UNROLL
      for (int j = 0; j < B; ++j)
        if (k0 + j < m.top_k) {
          TPCOMM_UNROLL
          for (int e = 0; e < W; ++e) acc[e] = fmaf(w[j], to_float(x[j][e]), acc[e]);
        }
    }
    if (shared != nullptr && !bad) {
      TPCOMM_UNROLL
      for (int j = 0; j < W; ++j) acc[j] += to_float(extra[j]);
    }
    TPCOMM_UNROLL
    for (int j = 0; j < W; ++j) out[j] = from_float<T>(bad ? NAN : acc[j]);
    return out;
  }
  TPCOMM_UNROLL
  for (int j = 0; j < W; ++j) {
    const std::int64_t e = e0 + j;
    if (e < count) out[j] = from_float<T>(combine_element<T>(m, e / m.hidden, e % m.hidden));
  }
  return out;
}

}  // namespace tpcomm::kernels
