// SPDX-License-Identifier: Apache-2.0
// The rows of a vocabulary-sharded LM head's exchange (`Group::lm_head_exchange`).
#pragma once

#include <cstdint>
#include <span>

namespace tpcomm {

/// How many rows (tokens) each rank of the group holds in a vocabulary-sharded LM head: the
/// `layout` argument of `Group::lm_head_exchange`. Rank r's rows form the r-th contiguous block
/// of every rank's shard logits, in rank order. The same on every rank of the call.
///
/// Non-owning: a per-rank layout refers to the caller's array, which must stay valid for the
/// call (not for the life of a captured graph: the counts are read when the call is made).
struct LmHeadLayout {
  /// >= 0: every rank holds this many rows; -1: `per_rank` says.
  std::int64_t equal_rows = -1;
  /// Rows of rank r at index r (world size entries, each >= 0); used when `equal_rows` is -1.
  std::span<const std::int64_t> per_rank;

  /// Every rank holds `rows` rows: the CUDA-graph case, where decode graphs pad every rank to
  /// one batch bucket.
  static constexpr LmHeadLayout equal(std::int64_t rows) noexcept { return {rows, {}}; }
  /// Rank r holds `rows[r]` rows (eager calls with unequal batches, a rank may hold none).
  static constexpr LmHeadLayout counts(std::span<const std::int64_t> rows) noexcept {
    return {-1, rows};
  }

  /// Rows of rank `rank`.
  [[nodiscard]] constexpr std::int64_t rows_of(int rank) const noexcept {
    return equal_rows >= 0 ? equal_rows : per_rank[static_cast<std::size_t>(rank)];
  }
};

}  // namespace tpcomm
