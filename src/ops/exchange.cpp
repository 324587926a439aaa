// SPDX-License-Identifier: Apache-2.0
#include "ops/exchange.hpp"

#include <algorithm>
#include <vector>

#include "backends/fingerprint.hpp"
#include "core/check.hpp"
#include "core/overlap.hpp"

namespace tpcomm {

namespace {

/// The custom exchange can serve a group of this size (its plans hold `kMaxRanks` regions).
bool plannable(const GroupShape& g) noexcept { return g.world >= 2 && g.world <= kMaxRanks; }

/// Checks `lm_head_exchange`'s shapes and layout (the views are checked already).
Status check_lm_head(const GroupShape& g, const TensorView& shards, const TensorView& out,
                     const LmHeadLayout& layout, Call* call) {
  auto bad = [&](auto&&... parts) {
    return refuse(call, detail::concat("lm_head_exchange: ", parts...));
  };
  if (shards.ndim != 2)
    return bad("shard_logits must be 2-d [tokens, shard columns], not ", shards.ndim, "-d");
  if (out.ndim != 2) return bad("out must be 2-d [rows, vocab], not ", out.ndim, "-d");
  if (shards.dtype != out.dtype)
    return bad("shard_logits are ", to_string(shards.dtype), ", out is ", to_string(out.dtype));
  if (layout.equal_rows < 0 && layout.per_rank.size() != static_cast<std::size_t>(g.world))
    return bad("the layout has ", layout.per_rank.size(), " per-rank counts for ", g.world,
               " ranks");
  std::int64_t total = 0;
  for (int r = 0; r < g.world; ++r) {
    if (layout.rows_of(r) < 0) return bad("rank ", r, " has ", layout.rows_of(r), " rows");
    total += layout.rows_of(r);
  }
  if (shards.shape[0] != total)
    return bad("shard_logits have ", shards.shape[0], " rows, the layout's ranks ", total);
  if (out.shape[0] != layout.rows_of(g.rank))
    return bad("out has ", out.shape[0], " rows, rank ", g.rank, " holds ", layout.rows_of(g.rank));
  const std::int64_t cols = shards.shape[1];
  if (cols < 1) return bad("shard_logits have no columns");
  if (out.shape[1] < 1 || out.shape[1] > g.world * cols)
    return bad("out has ", out.shape[1], " columns; the vocabulary of ", g.world, " shards of ",
               cols, " holds 1 to ", g.world * cols);
  if (overlaps(shards, out)) return bad("shard_logits and out overlap");
  return Status::kOk;
}

}  // namespace

Status make_all_gather(const GroupShape& g, const TensorView& in, const TensorView& out,
                       Call* call) noexcept {
  TPCOMM_TRY(check_pair(g, in, out, 1, g.world, "all_gather", call));
  call->empty = in.numel() == 0;  // the same on every rank
  Request& req = call->request;
  Exchange all{Exchange::Kind::kAllGather};
  if (plannable(g))
    all.plan = &call->exchange.emplace(plan_all_gather(in.nbytes(), g.world, g.rank));
  req = Request{Op::kAllGather, in, out, all};
  req.tag.fingerprint = fingerprint(Op::kAllGather, in.dtype, in.numel());
  return Status::kOk;
}

Status make_gather(const GroupShape& g, const TensorView& in, const TensorView& out, int root,
                   Call* call) noexcept {
  if (root < 0 || root >= g.world)
    return refuse(call, detail::concat("gather: root ", root, " is not a rank of ", g.world));
  // The root's output is checked like the all-gather's; elsewhere it is not used.
  if (g.rank == root) {
    TPCOMM_TRY(check_pair(g, in, out, 1, g.world, "gather", call));
  } else {
    TPCOMM_TRY(check_view(g, in, "input", "gather", call));
  }
  call->empty = in.numel() == 0;  // the same on every rank
  Request& req = call->request;
  Exchange gather{Exchange::Kind::kGather};
  gather.root = root;
  if (plannable(g))
    gather.plan = &call->exchange.emplace(plan_gather(in.nbytes(), g.world, g.rank, root));
  req = Request{Op::kGather, in, g.rank == root ? out : TensorView{}, gather};
  req.tag.fingerprint =
      fingerprint(Op::kGather, in.dtype, in.numel(), static_cast<std::uint32_t>(root));
  return Status::kOk;
}

Status make_all_to_all(const GroupShape& g, const TensorView& in, const TensorView& out,
                       Call* call) noexcept {
  TPCOMM_TRY(check_pair(g, in, out, 1, 1, "all_to_all", call));
  if (in.numel() % g.world != 0)
    return refuse(call, detail::concat("all_to_all: ", in.numel(),
                                       " elements do not split evenly over ", g.world, " ranks"));
  if (overlaps(in, out)) return refuse(call, "all_to_all: input and output overlap");
  call->empty = in.numel() == 0;  // the same on every rank
  Request& req = call->request;
  Exchange all{Exchange::Kind::kAllToAll};
  if (plannable(g))
    all.plan = &call->exchange.emplace(plan_all_to_all(in.nbytes(), g.world, g.rank));
  req = Request{Op::kAllToAll, in, out, all};
  req.tag.fingerprint = fingerprint(Op::kAllToAll, in.dtype, in.numel());
  return Status::kOk;
}

Status make_all_to_all(const GroupShape& g, const TensorView& in, const TensorView& out,
                       std::span<const std::int64_t> counts, Call* call) noexcept {
  TPCOMM_TRY(check_view(g, in, "input", "all_to_all", call));
  TPCOMM_TRY(check_view(g, out, "output", "all_to_all", call));
  const int world = g.world;
  if (counts.size() != static_cast<std::size_t>(world) * static_cast<std::size_t>(world))
    return refuse(call, detail::concat("all_to_all: ", counts.size(), " counts, expected ", world,
                                       " x ", world, " (elements from each rank to each rank)"));
  std::int64_t sent = 0;
  std::int64_t received = 0;
  std::int64_t moved = 0;  // by every rank: zero means nothing to do anywhere
  for (int s = 0; s < world; ++s) {
    for (int d = 0; d < world; ++d) {
      const std::int64_t c = counts[static_cast<std::size_t>(s) * world + d];
      if (c < 0)
        return refuse(call,
                      detail::concat("all_to_all: count from rank ", s, " to rank ", d, " is ", c));
      moved += c;
    }
    sent += counts[static_cast<std::size_t>(g.rank) * world + s];
    received += counts[static_cast<std::size_t>(s) * world + g.rank];
  }
  if (in.dtype != out.dtype)
    return refuse(call, detail::concat("all_to_all: input is ", to_string(in.dtype), ", output is ",
                                       to_string(out.dtype)));
  if (in.numel() != sent || out.numel() != received)
    return refuse(call, detail::concat("all_to_all: rank ", g.rank, " sends ", sent,
                                       " and receives ", received, " elements, but the input has ",
                                       in.numel(), " and the output ", out.numel()));
  if (overlaps(in, out)) return refuse(call, "all_to_all: input and output overlap");
  call->empty = moved == 0;
  Request& req = call->request;
  Exchange all{Exchange::Kind::kAllToAll};
  all.counts = counts.data();
  if (plannable(g))
    all.plan =
        &call->exchange.emplace(plan_all_to_all(counts, dtype_size(in.dtype), world, g.rank));
  req = Request{Op::kAllToAll, in, out, all};
  req.tag.fingerprint = fingerprint(Op::kAllToAll, in.dtype, moved, shape_hash(counts));
  return Status::kOk;
}

Status make_lm_head_exchange(const GroupShape& g, const TensorView& shard_logits,
                             const TensorView& out, const LmHeadLayout& layout,
                             Call* call) noexcept {
  TPCOMM_TRY(check_view(g, shard_logits, "shard_logits", "lm_head_exchange", call));
  TPCOMM_TRY(check_view(g, out, "out", "lm_head_exchange", call));
  TPCOMM_TRY(check_lm_head(g, shard_logits, out, layout, call));
  call->empty = shard_logits.numel() == 0;  // no rank has rows: the same everywhere
  Request& req = call->request;
  Exchange regions{Exchange::Kind::kRegions};
  regions.layout = &layout;
  if (plannable(g))
    regions.plan =
        &call->exchange.emplace(plan_lm_head(layout, shard_logits.shape[1], out.shape[1],
                                             dtype_size(shard_logits.dtype), g.world, g.rank));
  req = Request{Op::kLmHeadExchange, shard_logits, out, regions};
  std::vector<std::int64_t> shape{shard_logits.shape[1], out.shape[1]};
  for (int r = 0; r < g.world; ++r) shape.push_back(layout.rows_of(r));
  req.tag.fingerprint =
      fingerprint(Op::kLmHeadExchange, shard_logits.dtype, shard_logits.numel(), shape_hash(shape));
  return Status::kOk;
}

}  // namespace tpcomm
