// SPDX-License-Identifier: Apache-2.0
// make_parallel_layout: SGLang's group arithmetic, restated in the header.
#include "policy/parallel_layout.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace tpcomm {
namespace {

void check_positive(int value, std::string_view name) {
  TPCOMM_CHECK(value >= 1, Status::kInvalidArgument, name, " ", value, " must be at least 1");
}

GroupComms comms_for(int size, bool custom_ar) {
  // A group of one rank has nothing to communicate with.
  if (size < 2) return GroupComms{};
  return GroupComms{true, custom_ar};
}

/// Blocks of `size` consecutive ranks covering 0..world-1.
std::vector<std::vector<int>> contiguous_groups(int world, int size) {
  std::vector<std::vector<int>> groups;
  for (int start = 0; start < world; start += size) {
    std::vector<int> g(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) g[static_cast<std::size_t>(i)] = start + i;
    groups.push_back(std::move(g));
  }
  return groups;
}

/// The checks `make_parallel_layout` documents: every size at least 1, world_size == tp_size,
/// and the divisibility the derived widths need.
void check_sizes(int world_size, const ParallelConfig& config) {
  check_positive(world_size, "world_size");
  check_positive(config.tp_size, "tp_size");
  check_positive(config.dp_size, "dp_size");
  check_positive(config.attn_cp_size, "attn_cp_size");
  check_positive(config.moe_ep_size, "moe_ep_size");
  check_positive(config.moe_dp_size, "moe_dp_size");
  const int tp = config.tp_size;
  TPCOMM_CHECK(world_size == tp, Status::kInvalidArgument, "world_size ", world_size,
               " != tp_size ", tp,
               ": pipeline parallelism is not supported, so the TP group must span the world");

  const int attn_dp = config.enable_dp_attention ? config.dp_size : 1;
  const int attn_cp = config.attn_cp_size;
  TPCOMM_CHECK(tp % attn_cp == 0, Status::kInvalidArgument, "tp_size ", tp,
               " is not divisible by attn_cp_size ", attn_cp);
  if (config.enable_dp_attention) {
    TPCOMM_CHECK(tp % attn_dp == 0, Status::kInvalidArgument, "tp_size ", tp,
                 " is not divisible by dp_size ", attn_dp, " (DP attention)");
    TPCOMM_CHECK(tp % (attn_dp * attn_cp) == 0, Status::kInvalidArgument, "tp_size ", tp,
                 " is not divisible by dp_size ", attn_dp, " * attn_cp_size ", attn_cp,
                 " (DP attention)");
  }
  const int moe_ep = config.moe_ep_size;
  const int moe_dp = config.moe_dp_size;
  TPCOMM_CHECK(tp % moe_ep == 0, Status::kInvalidArgument, "tp_size ", tp,
               " is not divisible by moe_ep_size ", moe_ep);
  TPCOMM_CHECK(tp % moe_dp == 0, Status::kInvalidArgument, "tp_size ", tp,
               " is not divisible by moe_dp_size ", moe_dp);
  TPCOMM_CHECK(tp % (moe_ep * moe_dp) == 0, Status::kInvalidArgument, "tp_size ", tp,
               " is not divisible by moe_ep_size ", moe_ep, " * moe_dp_size ", moe_dp);
}

/// TP: blocks of tp consecutive ranks, with NCCL and the custom all-reduce.
GroupLayout tp_group_layout(int world_size, int tp) {
  GroupLayout l;
  l.kind = GroupKind::kTp;
  l.size = tp;
  l.groups = contiguous_groups(world_size, tp);
  l.is_tp_group = true;
  l.comms = comms_for(tp, /*custom_ar=*/true);
  return l;
}

/// `kind` served by the TP group itself.
GroupLayout aliased_to_tp(const GroupLayout& tp_layout, GroupKind kind) {
  GroupLayout l = tp_layout;
  l.kind = kind;
  return l;
}

/// `kind` as its own blocks of `size` consecutive ranks, NCCL only.
GroupLayout contiguous_layout(GroupKind kind, int world_size, int size) {
  GroupLayout l;
  l.kind = kind;
  l.size = size;
  l.groups = contiguous_groups(world_size, size);
  l.comms = comms_for(size, /*custom_ar=*/false);
  return l;
}

/// MOE_EP as its own groups, NCCL only: (moe_dp, moe_ep, moe_tp) with moe_tp fastest, so an EP
/// group strides by moe_tp inside its MoE-DP block.
GroupLayout strided_moe_ep_layout(const ParallelLayout& p) {
  const int tp = p.config.tp_size;
  const int moe_ep = p.config.moe_ep_size;
  const int moe_dp = p.config.moe_dp_size;
  const int moe_tp = p.moe_tp_size;
  GroupLayout l;
  l.kind = GroupKind::kMoeEp;
  l.size = moe_ep;
  for (int base = 0; base < p.world_size; base += tp) {
    for (int dp = 0; dp < moe_dp; ++dp) {
      for (int t = 0; t < moe_tp; ++t) {
        std::vector<int> g;
        g.reserve(static_cast<std::size_t>(moe_ep));
        const int start = base + dp * moe_ep * moe_tp + t;
        for (int e = 0; e < moe_ep; ++e) g.push_back(start + e * moe_tp);
        l.groups.push_back(std::move(g));
      }
    }
  }
  l.comms = comms_for(moe_ep, /*custom_ar=*/false);
  return l;
}

/// Puts `layout` in its kind's slot of `out`.
void set_layout(ParallelLayout& out, GroupLayout layout) {
  const auto index = static_cast<int>(layout.kind);
  out.kinds[index] = std::move(layout);
}

/// Gives the `kind` group the fusion workspace, unless it has one rank. A kind served by the TP
/// group object marks that object, so every kind aliased to TP reports it.
void carry_fusion(ParallelLayout& out, GroupKind kind) {
  const GroupLayout& l = out.layout(kind);
  if (l.size < 2) return;
  if (!l.is_tp_group) {
    out.kinds[static_cast<int>(kind)].comms.fusion = true;
    return;
  }
  for (GroupLayout& other : out.kinds)
    if (other.is_tp_group) other.comms.fusion = true;
}

}  // namespace

std::string_view to_string(GroupKind kind) noexcept {
  switch (kind) {
    case GroupKind::kTp:
      return "tp";
    case GroupKind::kAttnTp:
      return "attn_tp";
    case GroupKind::kMoeEp:
      return "moe_ep";
    case GroupKind::kMoeTp:
      return "moe_tp";
  }
  return "unknown";
}

const std::vector<int>& ParallelLayout::group_of(GroupKind kind, int rank) const {
  TPCOMM_CHECK(rank >= 0 && rank < world_size, Status::kInvalidArgument, "group_of: rank ", rank,
               " is not in 0..", world_size - 1);
  for (const auto& g : layout(kind).groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return g;
  TPCOMM_THROW(Status::kInternal, "group_of: rank ", rank, " is in no ", to_string(kind), " group");
}

int ParallelLayout::rank_in_group(GroupKind kind, int rank) const {
  const auto& g = group_of(kind, rank);
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}

ParallelLayout make_parallel_layout(int world_size, const ParallelConfig& config) {
  check_sizes(world_size, config);
  const int tp = config.tp_size;
  ParallelLayout out;
  out.world_size = world_size;
  out.config = config;
  out.attn_dp_size = config.enable_dp_attention ? config.dp_size : 1;
  out.attn_tp_size = tp / out.attn_dp_size / config.attn_cp_size;
  out.moe_tp_size = tp / config.moe_ep_size / config.moe_dp_size;

  set_layout(out, tp_group_layout(world_size, tp));
  const GroupLayout& tp_layout = out.layout(GroupKind::kTp);
  // ATTN_TP: (attn_dp, attn_cp, attn_tp) with attn_tp fastest, so its groups are contiguous.
  set_layout(out, out.attn_tp_size == tp
                      ? aliased_to_tp(tp_layout, GroupKind::kAttnTp)
                      : contiguous_layout(GroupKind::kAttnTp, world_size, out.attn_tp_size));
  set_layout(out, config.moe_ep_size == tp ? aliased_to_tp(tp_layout, GroupKind::kMoeEp)
                                           : strided_moe_ep_layout(out));
  // MOE_TP: contiguous blocks of moe_tp.
  set_layout(out, out.moe_tp_size == tp
                      ? aliased_to_tp(tp_layout, GroupKind::kMoeTp)
                      : contiguous_layout(GroupKind::kMoeTp, world_size, out.moe_tp_size));

  // The fusion workspaces: attention's, and the MoE one on EP when EP has peers, else on
  // MoE-TP. Where both land on one object (the TP group), it carries a single workspace.
  carry_fusion(out, GroupKind::kAttnTp);
  carry_fusion(out, config.moe_ep_size > 1 ? GroupKind::kMoeEp : GroupKind::kMoeTp);
  return out;
}

}  // namespace tpcomm
