// SPDX-License-Identifier: Apache-2.0
// 16-byte packs of elements: the unit every all-reduce kernel loads, reduces and stores. The
// packs, the conversions and `load_pack` are host code too (for the cpu tier's runs of the
// kernels' arithmetic: kernels/common/combine.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>

#include "kernels/common/host_device.hpp"

namespace tpcomm::kernels {

/// 16 bytes of elements of type T. Global memory is moved as whole packs (one 128-bit access
/// per thread) wherever the address is 16-byte aligned and the pack is complete.
template <class T>
struct alignas(16) Pack {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  uint4 raw;
  TPCOMM_HOST_DEVICE T& operator[](int i) { return reinterpret_cast<T*>(&raw)[i]; }
  TPCOMM_HOST_DEVICE const T& operator[](int i) const {
    return reinterpret_cast<const T*>(&raw)[i];
  }
};

TPCOMM_HOST_DEVICE float to_float(float x) { return x; }
TPCOMM_HOST_DEVICE float to_float(__half x) { return __half2float(x); }
TPCOMM_HOST_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
TPCOMM_HOST_DEVICE T from_float(float x);
template <>
TPCOMM_HOST_DEVICE float from_float<float>(float x) {
  return x;
}
template <>
TPCOMM_HOST_DEVICE __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
TPCOMM_HOST_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

TPCOMM_HOST_DEVICE bool is_aligned16(const void* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;
}

/// Pack `v` of an array of `count` elements: elements [v * kElems, v * kElems + kElems). The
/// last pack may be partial; its missing elements read as zero and nothing past `count` is
/// touched. `aligned` says whether `p` is 16-byte aligned.
template <class T>
TPCOMM_HOST_DEVICE Pack<T> load_pack(const T* p, std::int64_t v, std::int64_t count, bool aligned) {
  constexpr int W = Pack<T>::kElems;
  const std::int64_t first = v * W;
  Pack<T> out;
  if (aligned && first + W <= count) {
    out.raw = *reinterpret_cast<const uint4*>(p + first);
    return out;
  }
  out.raw = make_uint4(0, 0, 0, 0);
  TPCOMM_UNROLL
  for (int i = 0; i < W; ++i)
    if (first + i < count) out[i] = p[first + i];
  return out;
}

/// Stores pack `v` into an array of `count` elements (partial at the end, any alignment).
template <class T>
__device__ __forceinline__ void store_pack(T* p, std::int64_t v, std::int64_t count, bool aligned,
                                           const Pack<T>& x) {
  constexpr int W = Pack<T>::kElems;
  const std::int64_t first = v * W;
  if (aligned && first + W <= count) {
    *reinterpret_cast<uint4*>(p + first) = x.raw;
    return;
  }
  TPCOMM_UNROLL
  for (int i = 0; i < W; ++i)
    if (first + i < count) p[first + i] = x[i];
}

/// Pack `v` of a workspace buffer (staging or scratch): always aligned and large enough to
/// hold whole packs, so no bounds are needed.
template <class T>
__device__ __forceinline__ Pack<T> load_pack_ws(const T* p, std::int64_t v) {
  Pack<T> out;
  out.raw = reinterpret_cast<const uint4*>(p)[v];
  return out;
}
template <class T>
__device__ __forceinline__ void store_pack_ws(T* p, std::int64_t v, const Pack<T>& x) {
  reinterpret_cast<uint4*>(p)[v] = x.raw;
}

}  // namespace tpcomm::kernels
