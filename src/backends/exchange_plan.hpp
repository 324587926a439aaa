// SPDX-License-Identifier: Apache-2.0
// What each rank copies from each peer in an all-gather, an all-to-all and the LM-head exchange
// (NOTE [exchange] in kernels/exchange.cu): the regions the custom exchange kernel copies.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "ipc/layout.hpp"
#include "kernels/kernels.hpp"
#include "tpcomm/lm_head.hpp"

namespace tpcomm {

/// One rank's exchange (all-gather, all-to-all, the LM-head exchange; NOTE [exchange] in
/// kernels/exchange.cu): the region it copies from each rank, the region each rank copies from
/// it (what the push form sends: NOTE [exchange push] in kernels/exchange_push.cu), the bytes of
/// its own input (what it stages for its peers), and, computed alike on every rank, the largest
/// input of any rank (which decides whether the staging holds the call), the most bytes any rank
/// receives (which sizes the launch), the most any rank sends another and the Lamport slot the
/// push form needs. Pure host
/// arithmetic, tested on the CPU.
struct ExchangePlan {
  std::array<kernels::CopyRegion, kMaxRanks> from{};
  std::array<kernels::CopyRegion, kMaxRanks> to{};
  std::int64_t input_bytes = 0;
  std::int64_t largest_input = 0;
  std::int64_t largest_output = 0;
  /// The most bytes any rank sends another (what the built-in choice of a form goes by).
  std::int64_t largest_region = 0;
  /// Bytes of a Lamport slot that the push form needs for the largest region any rank sends
  /// another; 0 where some region's rows are not whole 4-byte words (the pull form only).
  std::int64_t push_slot_bytes = 0;
};

/// Gather of `bytes` bytes per rank to rank `root`: rank r's input lands at byte `r * bytes` of
/// root's output; the other ranks receive nothing.
[[nodiscard]] ExchangePlan plan_gather(std::int64_t bytes, int world, int rank, int root) noexcept;

/// All-gather of `bytes` bytes per rank: rank r's input lands at byte `r * bytes` of the output.
/// `world` in 2..kMaxRanks, `rank` in 0..world-1 (as for every plan).
[[nodiscard]] ExchangePlan plan_all_gather(std::int64_t bytes, int world, int rank) noexcept;

/// Equal-split all-to-all of `bytes` bytes per rank's input (a multiple of `world`): chunk j of
/// each input goes to rank j, and lands as chunk i of rank j's output when it came from rank i.
[[nodiscard]] ExchangePlan plan_all_to_all(std::int64_t bytes, int world, int rank) noexcept;

/// All-to-all with per-peer counts: `counts[s * world + d]` elements of `elem_bytes` bytes go
/// from rank s to rank d, taken in order of d from s's input and stored in order of s in d's
/// output. `counts` has world * world entries, each >= 0.
[[nodiscard]] ExchangePlan plan_all_to_all(std::span<const std::int64_t> counts,
                                           std::int64_t elem_bytes, int world, int rank) noexcept;

/// The LM-head exchange: every rank's shard logits are [T, shard_cols] (T the sum of the
/// layout's rows) in rank-block order; rank `rank` receives its rows of every shard s into
/// columns [s * shard_cols, min((s + 1) * shard_cols, vocab)) of its [rows, vocab] output.
[[nodiscard]] ExchangePlan plan_lm_head(const LmHeadLayout& layout, std::int64_t shard_cols,
                                        std::int64_t vocab, std::int64_t elem_bytes, int world,
                                        int rank) noexcept;

/// Columns of shard `shard` that the LM-head exchange writes: those below `vocab`.
[[nodiscard]] constexpr std::int64_t lm_head_columns(std::int64_t shard, std::int64_t shard_cols,
                                                     std::int64_t vocab) noexcept {
  const std::int64_t left = vocab - shard * shard_cols;
  return left <= 0 ? 0 : left < shard_cols ? left : shard_cols;
}

}  // namespace tpcomm
