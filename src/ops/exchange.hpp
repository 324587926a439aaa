// SPDX-License-Identifier: Apache-2.0
// The exchanges (all-gather, all-to-all, the LM-head exchange): their checks and requests
// (ops/call.hpp), with what each rank copies from each peer (`ExchangePlan`,
// backends/exchange_plan.hpp), and the LM head's path where the custom exchange does not serve
// it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "backends/backend.hpp"
#include "backends/exchange_plan.hpp"
#include "ops/call.hpp"
#include "tpcomm/lm_head.hpp"

namespace tpcomm {

/// `Group::all_gather`: `out` holds world x `in`'s elements, rank r's at r x `in`'s.
Status make_all_gather(const GroupShape& g, const TensorView& in, const TensorView& out,
                       Call* call) noexcept;

/// `Group::gather`: on `root`, `out` holds world x `in`'s elements, rank r's at r x `in`'s;
/// elsewhere `out` is not used.
Status make_gather(const GroupShape& g, const TensorView& in, const TensorView& out, int root,
                   Call* call) noexcept;

/// `Group::all_to_all`, the equal split: `in` splits into world equal chunks.
Status make_all_to_all(const GroupShape& g, const TensorView& in, const TensorView& out,
                       Call* call) noexcept;

/// `Group::all_to_all` with per-peer `counts` (world x world, the same on every rank).
Status make_all_to_all(const GroupShape& g, const TensorView& in, const TensorView& out,
                       std::span<const std::int64_t> counts, Call* call) noexcept;

/// `Group::lm_head_exchange` (tpcomm/group.hpp says the rules).
Status make_lm_head_exchange(const GroupShape& g, const TensorView& shard_logits,
                             const TensorView& out, const LmHeadLayout& layout,
                             Call* call) noexcept;

/// The LM-head exchange where the custom exchange does not serve it, as an entry of `chain`:
/// the shards all-gathered through the chain into a temporary ([world, T, S]), then this rank's
/// rows of each shard copied into its columns (SGLang's path). Every rank runs the same
/// all-gather, so the ranks' paths agree. `prepares`: its `Backend::prepare` keeps a temporary
/// for the gathered shards of inputs of up to the prepared size, so that those calls allocate
/// nothing (larger ones take a stream-ordered allocation of their own); not graph-safe, never
/// shrinks, throws `Error` when the allocation fails.
[[nodiscard]] std::unique_ptr<Backend> make_gather_copy_backend(BackendChain& chain,
                                                                const GroupShape& g, bool prepares);

}  // namespace tpcomm
