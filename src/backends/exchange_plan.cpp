// SPDX-License-Identifier: Apache-2.0
#include "backends/exchange_plan.hpp"

#include <algorithm>

namespace tpcomm {

namespace {

/// Fills `p.from`, `p.to`, `p.largest_region` and `p.push_slot_bytes` from `region(s, d)`, the
/// region rank d copies from rank s, for every pair of ranks: every rank works out every pair
/// alike, so the push form is chosen alike everywhere.
template <class Region>
void add_regions(ExchangePlan& p, int world, int rank, Region&& region) {
  std::int64_t largest = 0;
  bool words = true;
  for (int s = 0; s < world; ++s) {
    for (int d = 0; d < world; ++d) {
      const kernels::CopyRegion c = region(s, d);
      if (d == rank) p.from[s] = c;
      if (s == rank) p.to[d] = c;
      if (c.rows <= 0 || c.row_bytes <= 0) continue;
      words = words && c.row_bytes % 4 == 0;
      if (s != d) largest = std::max(largest, c.rows * c.row_bytes);
    }
  }
  p.largest_region = largest;
  p.push_slot_bytes = words ? kernels::exchange_push_slot_bytes(largest) : 0;
}

}  // namespace

ExchangePlan plan_all_gather(std::int64_t bytes, int world, int rank) noexcept {
  ExchangePlan p;
  add_regions(p, world, rank, [&](int s, int /*d*/) {
    return kernels::CopyRegion{0, bytes, s * bytes, bytes, 1, bytes};
  });
  p.input_bytes = p.largest_input = bytes;
  p.largest_output = world * bytes;
  return p;
}

ExchangePlan plan_gather(std::int64_t bytes, int world, int rank, int root) noexcept {
  ExchangePlan p;
  add_regions(p, world, rank, [&](int s, int d) {
    return d == root ? kernels::CopyRegion{0, bytes, s * bytes, bytes, 1, bytes}
                     : kernels::CopyRegion{};
  });
  p.input_bytes = p.largest_input = bytes;
  p.largest_output = world * bytes;
  return p;
}

ExchangePlan plan_all_to_all(std::int64_t bytes, int world, int rank) noexcept {
  ExchangePlan p;
  const std::int64_t chunk = bytes / world;
  add_regions(p, world, rank, [&](int s, int d) {
    return kernels::CopyRegion{d * chunk, chunk, s * chunk, chunk, 1, chunk};
  });
  p.input_bytes = p.largest_input = p.largest_output = bytes;
  return p;
}

ExchangePlan plan_all_to_all(std::span<const std::int64_t> counts, std::int64_t elem_bytes,
                             int world, int rank) noexcept {
  auto count = [&](int s, int d) { return counts[static_cast<std::size_t>(s) * world + d]; };
  // sent_before[s][d]: what s sends to the ranks before d; received_before[s][d]: what d
  // receives from the ranks before s.
  std::array<std::array<std::int64_t, kMaxRanks + 1>, kMaxRanks + 1> sent_before{};
  std::array<std::array<std::int64_t, kMaxRanks + 1>, kMaxRanks + 1> received_before{};
  for (int s = 0; s < world; ++s)
    for (int d = 0; d < world; ++d) {
      sent_before[s][d + 1] = sent_before[s][d] + count(s, d);
      received_before[s + 1][d] = received_before[s][d] + count(s, d);
    }
  ExchangePlan p;
  add_regions(p, world, rank, [&](int s, int d) {
    const std::int64_t bytes = count(s, d) * elem_bytes;
    return kernels::CopyRegion{
        sent_before[s][d] * elem_bytes, bytes, received_before[s][d] * elem_bytes, bytes, 1, bytes};
  });
  p.input_bytes = sent_before[rank][world] * elem_bytes;
  for (int r = 0; r < world; ++r) {
    p.largest_input = std::max(p.largest_input, sent_before[r][world] * elem_bytes);
    p.largest_output = std::max(p.largest_output, received_before[world][r] * elem_bytes);
  }
  return p;
}

ExchangePlan plan_lm_head(const LmHeadLayout& layout, std::int64_t shard_cols, std::int64_t vocab,
                          std::int64_t elem_bytes, int world, int rank) noexcept {
  std::array<std::int64_t, kMaxRanks + 1> first{};  // rank r's first row in every shard
  std::int64_t most = 0;                            // the most rows any rank holds
  for (int r = 0; r < world; ++r) {
    first[r + 1] = first[r] + layout.rows_of(r);
    most = std::max(most, layout.rows_of(r));
  }
  const std::int64_t pitch = shard_cols * elem_bytes;
  ExchangePlan p;
  add_regions(p, world, rank, [&](int s, int d) {
    return kernels::CopyRegion{
        first[d] * pitch,  pitch,
        s * pitch,         vocab * elem_bytes,
        layout.rows_of(d), lm_head_columns(s, shard_cols, vocab) * elem_bytes};
  });
  p.input_bytes = p.largest_input = first[world] * pitch;
  p.largest_output = most * vocab * elem_bytes;
  return p;
}

}  // namespace tpcomm
