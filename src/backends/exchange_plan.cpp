// SPDX-License-Identifier: Apache-2.0
#include "backends/exchange_plan.hpp"

#include <algorithm>

namespace tpcomm {

ExchangePlan plan_all_gather(std::int64_t bytes, int world, int rank) noexcept {
  (void)rank;
  ExchangePlan p;
  for (int s = 0; s < world; ++s) p.from[s] = {0, bytes, s * bytes, bytes, 1, bytes};
  p.input_bytes = p.largest_input = bytes;
  p.largest_output = world * bytes;
  return p;
}

ExchangePlan plan_all_to_all(std::int64_t bytes, int world, int rank) noexcept {
  ExchangePlan p;
  const std::int64_t chunk = bytes / world;
  for (int s = 0; s < world; ++s) p.from[s] = {rank * chunk, chunk, s * chunk, chunk, 1, chunk};
  p.input_bytes = p.largest_input = p.largest_output = bytes;
  return p;
}

ExchangePlan plan_all_to_all(std::span<const std::int64_t> counts, std::int64_t elem_bytes,
                             int world, int rank) noexcept {
  auto count = [&](int s, int d) { return counts[static_cast<std::size_t>(s) * world + d]; };
  ExchangePlan p;
  std::int64_t received = 0;
  for (int s = 0; s < world; ++s) {
    std::int64_t before = 0;  // what s sends to the ranks before this one
    std::int64_t sent = 0;
    for (int d = 0; d < world; ++d) {
      if (d < rank) before += count(s, d);
      sent += count(s, d);
    }
    const std::int64_t bytes = count(s, rank) * elem_bytes;
    p.from[s] = {before * elem_bytes, bytes, received, bytes, 1, bytes};
    received += bytes;
    if (s == rank) p.input_bytes = sent * elem_bytes;
    if (sent * elem_bytes > p.largest_input) p.largest_input = sent * elem_bytes;
  }
  for (int d = 0; d < world; ++d) {
    std::int64_t got = 0;
    for (int s = 0; s < world; ++s) got += count(s, d);
    if (got * elem_bytes > p.largest_output) p.largest_output = got * elem_bytes;
  }
  return p;
}

ExchangePlan plan_lm_head(const LmHeadLayout& layout, std::int64_t shard_cols, std::int64_t vocab,
                          std::int64_t elem_bytes, int world, int rank) noexcept {
  std::int64_t total = 0;
  std::int64_t first = 0;  // this rank's first row in every shard
  std::int64_t most = 0;   // the most rows any rank holds
  for (int r = 0; r < world; ++r) {
    if (r == rank) first = total;
    total += layout.rows_of(r);
    most = std::max(most, layout.rows_of(r));
  }
  const std::int64_t pitch = shard_cols * elem_bytes;
  ExchangePlan p;
  for (int s = 0; s < world; ++s)
    p.from[s] = {first * pitch,
                 pitch,
                 s * pitch,
                 vocab * elem_bytes,
                 layout.rows_of(rank),
                 lm_head_columns(s, shard_cols, vocab) * elem_bytes};
  p.input_bytes = p.largest_input = total * pitch;
  p.largest_output = most * vocab * elem_bytes;
  return p;
}

}  // namespace tpcomm
