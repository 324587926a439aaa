// SPDX-License-Identifier: Apache-2.0
// How the exchange's push form lays a region out in lines, and the access widths of regions:
// host and device code alike, so that the cpu tier runs the data path the kernel runs (NOTE
// [exchange push] in kernels/exchange_push.cu).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/common/host_device.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

/// The two data words of one line (the flag words travel beside them).
struct Line {
  std::uint32_t lo;
  std::uint32_t hi;
};

/// The lines of one region flattened row-major into 4-byte words: words 2i and 2i + 1 make line
/// i (the second 0 past the end of an odd count).
struct Lines {
  std::uint32_t per_row;  // words a row
  std::uint32_t words;
  std::uint32_t count;

  TPCOMM_HOST_DEVICE explicit Lines(const CopyRegion& c)
      : per_row(static_cast<std::uint32_t>(c.row_bytes / 4)),
        words(static_cast<std::uint32_t>(c.rows) * per_row),
        count((words + 1) / 2) {}
};

/// Byte offset of word `k` of region `c` (`per_row` words a row), on the source side or the
/// destination side.
TPCOMM_HOST_DEVICE std::int64_t word_offset(const CopyRegion& c, bool source, std::uint32_t per_row,
                                            std::uint32_t k) {
  const std::uint32_t row = k / per_row;
  const std::uint32_t col = k - row * per_row;
  return (source ? c.src_offset + row * c.src_pitch : c.dst_offset + row * c.dst_pitch) +
         std::int64_t{col} * 4;
}

/// A word at `p`, read in accesses of `A` bytes (4 or more: one access).
template <int A>
TPCOMM_HOST_DEVICE std::uint32_t load_word(const char* p) {
  if constexpr (A >= 4) {
    return *reinterpret_cast<const std::uint32_t*>(p);
  } else if constexpr (A == 2) {
    const auto* q = reinterpret_cast<const std::uint16_t*>(p);
    return q[0] | std::uint32_t{q[1]} << 16;
  } else {
    const auto* q = reinterpret_cast<const std::uint8_t*>(p);
    return q[0] | std::uint32_t{q[1]} << 8 | std::uint32_t{q[2]} << 16 | std::uint32_t{q[3]} << 24;
  }
}

template <int A>
TPCOMM_HOST_DEVICE void store_word(char* p, std::uint32_t w) {
  if constexpr (A >= 4) {
    *reinterpret_cast<std::uint32_t*>(p) = w;
  } else if constexpr (A == 2) {
    auto* q = reinterpret_cast<std::uint16_t*>(p);
    q[0] = static_cast<std::uint16_t>(w);
    q[1] = static_cast<std::uint16_t>(w >> 16);
  } else {
    auto* q = reinterpret_cast<std::uint8_t*>(p);
    for (int b = 0; b < 4; ++b) q[b] = static_cast<std::uint8_t>(w >> (8 * b));
  }
}

/// Line `i` of region `c` read from `base` (the source side). With A = 8 the rows are whole
/// lines (their bytes a multiple of 8), and a line is one 8-byte load.
template <int A>
TPCOMM_HOST_DEVICE Line load_line(const char* base, const CopyRegion& c, const Lines& l,
                                  std::uint32_t i) {
  const std::uint32_t k = 2 * i;
  if constexpr (A == 8) {
    const std::uint64_t w =
        *reinterpret_cast<const std::uint64_t*>(base + word_offset(c, true, l.per_row, k));
    return {static_cast<std::uint32_t>(w), static_cast<std::uint32_t>(w >> 32)};
  } else {
    Line v{load_word<A>(base + word_offset(c, true, l.per_row, k)), 0u};
    if (k + 1 < l.words) v.hi = load_word<A>(base + word_offset(c, true, l.per_row, k + 1));
    return v;
  }
}

/// Line `i` of region `c` written at `base` (the destination side).
template <int A>
TPCOMM_HOST_DEVICE void store_line(char* base, const CopyRegion& c, const Lines& l, std::uint32_t i,
                                   Line v) {
  const std::uint32_t k = 2 * i;
  if constexpr (A == 8) {
    *reinterpret_cast<std::uint64_t*>(base + word_offset(c, false, l.per_row, k)) =
        std::uint64_t{v.lo} | std::uint64_t{v.hi} << 32;
  } else {
    store_word<A>(base + word_offset(c, false, l.per_row, k), v.lo);
    if (k + 1 < l.words) store_word<A>(base + word_offset(c, false, l.per_row, k + 1), v.hi);
  }
}

/// The entries (lines, or accesses) of `N` regions taken as one list, one region after another:
/// entry g of the list goes to thread g mod stride of the grid, so that at small sizes each
/// thread has an entry or two whichever regions they are in, and a thread loads the entries of
/// several regions in one batch (one round trip to memory, where a region at a time took one a
/// region).
template <int N>
struct RegionList {
  std::uint32_t end[N];  // entries of regions 0..k together (below 2^32: `access_for`)

  /// `count(k)`: the entries of region k.
  template <class Count>
  TPCOMM_HOST_DEVICE explicit RegionList(Count&& count) {
    std::uint32_t total = 0;
    TPCOMM_UNROLL
    for (int k = 0; k < N; ++k) end[k] = total += count(k);
  }
  [[nodiscard]] TPCOMM_HOST_DEVICE std::uint32_t total() const { return end[N - 1]; }
  /// The region that entry `g` (below `total()`) belongs to.
  [[nodiscard]] TPCOMM_HOST_DEVICE int region(std::uint32_t g) const {
    int k = 0;
    TPCOMM_UNROLL
    for (int j = 0; j < N - 1; ++j) k += g >= end[j] ? 1 : 0;
    return k;
  }
  /// Entry `g`'s place within region `k` (`region(g)`). `end[k - 1]` is picked by comparisons,
  /// not by indexing, so that `end` stays in registers (an array indexed at run time lives in
  /// the thread's local memory).
  [[nodiscard]] TPCOMM_HOST_DEVICE std::uint32_t index(std::uint32_t g, int k) const {
    std::uint32_t start = 0;
    TPCOMM_UNROLL
    for (int j = 0; j < N - 1; ++j) start = j + 1 == k ? end[j] : start;
    return g - start;
  }
};

/// The widest access (16 down to 1 bytes) that divides every value of `values`.
inline int widest_access(std::initializer_list<std::int64_t> values) {
  int access = 16;
  for (std::int64_t v : values)
    while (v % access != 0) access /= 2;
  return access;
}

inline std::int64_t address(const void* p) {
  return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
}

/// The widest access that every one of `regions` regions of `from`, `output` and `sources`
/// (when given) allow; 0 when a region is malformed or the regions together need 2^32 accesses or
/// more.
inline int access_for(const CopyRegion* from, int regions, const void* output,
                      const char* const* sources) {
  int access = widest_access({address(output)});
  for (int r = 0; r < regions; ++r) {
    const CopyRegion& c = from[r];
    if (c.rows < 0 || c.row_bytes < 0) return 0;
    if (c.rows == 0 || c.row_bytes == 0) continue;
    access =
        widest_access({access, c.src_offset, c.src_pitch, c.dst_offset, c.dst_pitch, c.row_bytes});
    if (sources != nullptr) access = widest_access({access, address(sources[r])});
  }
  std::int64_t total = 0;  // below 2^32 (`RegionList`)
  for (int r = 0; r < regions; ++r) {
    const CopyRegion& c = from[r];
    if (c.rows > 0 && (total += c.rows * (c.row_bytes / access)) >= (std::int64_t{1} << 32))
      return 0;
  }
  return access;
}

}  // namespace tpcomm::kernels
