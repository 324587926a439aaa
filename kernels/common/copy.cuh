// SPDX-License-Identifier: Apache-2.0
// Copying regions (`CopyRegion`) in accesses of one width, and poisoning them: what the exchange
// kernels share (NOTE [exchange] in kernels/exchange.cu).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/common/lines.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

template <int V>
struct Access;
template <>
struct Access<16> {
  using type = uint4;
};
template <>
struct Access<8> {
  using type = uint2;
};
template <>
struct Access<4> {
  using type = std::uint32_t;
};
template <>
struct Access<2> {
  using type = std::uint16_t;
};
template <>
struct Access<1> {
  using type = std::uint8_t;
};

/// Copies regions 0..N-1 (`region(k)`, read from `source(k)`) into `out` with `V`-byte accesses,
/// as one list of accesses (`RegionList`): four in flight per thread, whichever regions they are
/// in. Together the regions make fewer than 2^32 accesses (`access_for`).
template <int N, int V, class Source, class Region>
__device__ __forceinline__ void copy_regions(const Source& source, const Region& region, char* out,
                                             std::uint64_t first, std::uint64_t stride) {
  using A = typename Access<V>::type;
  const RegionList<N> list([&](int k) {
    const CopyRegion c = region(k);
    return static_cast<std::uint32_t>(c.rows * (c.row_bytes / V));
  });
  constexpr int kUnroll = 4;
  for (std::uint64_t g0 = first; g0 < list.total(); g0 += kUnroll * stride) {
    A v[kUnroll];
    std::int64_t at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const std::uint64_t g = g0 + u * stride;
      if (g >= list.total()) break;
      const int k = list.region(static_cast<std::uint32_t>(g));
      const CopyRegion c = region(k);
      const auto per_row = static_cast<std::uint32_t>(c.row_bytes / V);
      const std::uint32_t i = list.index(static_cast<std::uint32_t>(g), k);
      const std::uint32_t row = i / per_row;
      const std::uint32_t col = i - row * per_row;
      v[u] = *reinterpret_cast<const A*>(source(k) + c.src_offset + row * c.src_pitch +
                                         std::int64_t{col} * V);
      at[u] = c.dst_offset + row * c.dst_pitch + std::int64_t{col} * V;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (g0 + u * stride < list.total()) *reinterpret_cast<A*>(out + at[u]) = v[u];
  }
}

/// Copies region `c` of `src` into `out` with `V`-byte accesses, four in flight per thread.
template <int V>
__device__ __forceinline__ void copy_region(const char* src, char* out, const CopyRegion& c,
                                            std::uint64_t first, std::uint64_t stride) {
  copy_regions<1, V>([&](int) { return src; }, [&](int) { return c; }, out, first, stride);
}

/// The access of `V` bytes at byte `offset` of an output whose elements' poison is `pattern`
/// (`ExchangeParams::poison`: 8 bytes of elements from an offset that is a multiple of 8).
template <int V>
__device__ __forceinline__ typename Access<V>::type poison_access(std::uint64_t pattern,
                                                                  std::int64_t offset) {
  typename Access<V>::type v;
  if constexpr (V >= 8) {
    for (int i = 0; i < V / 8; ++i) memcpy(reinterpret_cast<char*>(&v) + 8 * i, &pattern, 8);
  } else {
    const std::uint64_t from = pattern >> (8 * (offset & 7));
    memcpy(&v, &from, V);
  }
  return v;
}

/// Fills region `c` of `out` with the poison of its elements (`pattern`; NOTE [poisoned
/// outputs] in kernels/common/poison.cuh), the whole of it from this block alone.
template <int V>
__device__ __forceinline__ void poison_region(char* out, const CopyRegion& c,
                                              std::uint64_t pattern) {
  using A = typename Access<V>::type;
  const auto per_row = static_cast<std::uint32_t>(c.row_bytes / V);
  if (per_row == 0 || c.rows == 0) return;
  const std::uint64_t n = static_cast<std::uint64_t>(c.rows) * per_row;
  for (std::uint64_t k = threadIdx.x; k < n; k += blockDim.x) {
    const std::uint32_t row = static_cast<std::uint32_t>(k) / per_row;
    const std::uint32_t col = static_cast<std::uint32_t>(k) - row * per_row;
    const std::int64_t at = c.dst_offset + row * c.dst_pitch + std::int64_t{col} * V;
    *reinterpret_cast<A*>(out + at) = poison_access<V>(pattern, at);
  }
}

/// What a block of the exchange that gives up leaves: every region of its output poisoned.
template <int R, int V>
__device__ __forceinline__ void poison_exchange(const ExchangeParams& p) {
#pragma unroll
  for (int s = 0; s < R; ++s) poison_region<V>(static_cast<char*>(p.output), p.from[s], p.poison);
}

/// `f.template operator()<V>()` for an access width of 16, 8, 4, 2 or 1 bytes.
template <class F>
inline const void* dispatch_access(int bytes, F&& f) {
  switch (bytes) {
    case 16:
      return f.template operator()<16>();
    case 8:
      return f.template operator()<8>();
    case 4:
      return f.template operator()<4>();
    case 2:
      return f.template operator()<2>();
    case 1:
      return f.template operator()<1>();
    default:
      return nullptr;
  }
}

/// The push form's share of `warm_up_exchange` and `exchange_max_blocks_per_sm`
/// (kernels/exchange_push.cu).
Status warm_up_exchange_push(int world_size, Stream stream) noexcept;
int exchange_push_max_blocks_per_sm(int world_size, int threads) noexcept;

}  // namespace tpcomm::kernels
