// SPDX-License-Identifier: Apache-2.0
// Which ranks form SGLang's parallel groups, and which communicators each group gets.
//
// The rules follow SGLang's `initialize_model_parallel` in
// `python/sglang/srt/distributed/parallel_state.py` (sgl-project/sglang, commit 0005973a, the
// newest version read; the derived widths come from `derive_parallel_widths` in
// `python/sglang/srt/runtime_context.py`). Restated:
//
// Widths. attn_dp = dp_size with DP attention, else 1; attn_tp = tp / attn_dp / attn_cp;
// moe_tp = tp / moe_ep / moe_dp.
//
// TP: blocks of tp consecutive ranks. It owns NCCL and the custom all-reduce.
//
// ATTN_TP: when attn_tp == tp it is the TP group itself. Otherwise every TP group is cut into
// attn_dp * attn_cp blocks of attn_tp consecutive ranks (rank = (dp * attn_cp + cp) * attn_tp
// + tp_in_block), with the custom all-reduce off (SGLang builds PyNccl for it only to sync
// sampled tokens or for symmetric memory): NCCL only.
//
// MOE_EP: when moe_ep == tp it is the TP group itself (SGLang keeps a separate group on NPUs
// only). Otherwise, inside each block of moe_ep * moe_tp consecutive ranks (one per MoE-DP
// index), the ranks with the same offset modulo moe_tp form a group: a stride-moe_tp group of
// moe_ep ranks. PyNccl and the custom all-reduce are off, so it reduces over plain NCCL.
//
// MOE_TP: when moe_tp == tp it is the TP group itself. Otherwise blocks of moe_tp consecutive
// ranks (moe_ep * moe_dp of them per TP group), again NCCL only.
//
// A group of one rank gets no communicator at all (SGLang builds none below two ranks).
//
// Fusion workspace (the Lamport buffers of the fused all-reduce + residual + RMSNorm, which
// also serve small plain all-reduces). SGLang keeps exactly two per process, one for attention
// and one for MoE, and tags the groups that use them (`_tag_groups_for_flashinfer_allreduce_
// only` in `distributed/parallel_state.py`, rule as its unit tests pin it):
//   - the ATTN_TP group carries one;
//   - exactly one MoE group carries one: MOE_EP when moe_ep > 1, else MOE_TP. The other MoE
//     group carries none, so that in hybrid EP + MoE-TP a reduction over one group never
//     reaches the workspace of the other's peers;
//   - when one group object plays both roles (e.g. tp = ep = 4, where ATTN_TP, MOE_EP and TP are
//     one object), attention wins the tag; being one object it carries one workspace;
//   - a group of one rank carries none;
//   - the TP group carries one only when it is the ATTN_TP group or the chosen MoE group (it
//     then IS that object); the kinds aliased to it report the same.
// A group that carries the workspace gets the custom backend (which owns the Lamport buffers)
// besides NCCL, even where SGLang's rules above leave it NCCL only.
//
// Sizes. Pipeline parallelism is out of scope, so SGLang's world = tp * pp becomes
// world_size == tp_size: there is exactly one TP group. Without DP attention, dp_size counts
// independent replicas, each its own world, so it does not enter the layout. The checks are
// the divisibility the arithmetic above needs: tp divisible by attn_cp, by attn_dp * attn_cp,
// by moe_ep and by moe_ep * moe_dp. SGLang's server-argument validation adds feature rules
// (`handle_context_parallelism`: moe_dp > 1 only together with attn_cp == moe_dp, and then
// moe_ep * moe_dp == tp when moe_ep > 1); they are not layout rules and are not enforced here.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tpcomm/parallel_config.hpp"

namespace tpcomm {

/// The groups a layout describes.
enum class GroupKind : std::uint8_t {
  /// Tensor parallelism: dense layers, the LM head.
  kTp,
  /// Attention tensor parallelism (narrower than TP under DP attention or attention CP).
  kAttnTp,
  /// MoE expert parallelism: ranks holding different experts.
  kMoeEp,
  /// MoE tensor parallelism: ranks holding slices of the same experts.
  kMoeTp,
};

inline constexpr int kGroupKindCount = 4;

/// "tp", "attn_tp", "moe_ep", "moe_tp".
std::string_view to_string(GroupKind kind) noexcept;

/// The communicators a group is built with, in tpcomm's terms.
struct GroupComms {
  /// An NCCL communicator over the group's ranks.
  bool nccl = false;
  /// The custom all-reduce (peer memory, one-shot / two-shot kernels).
  bool custom_ar = false;
  /// The group carries the fusion workspace (Lamport buffers, owned by the custom backend, so a
  /// group with `fusion` but not `custom_ar` still builds that backend): the attention-TP group
  /// and the one chosen MoE group, by the rule at the top of this file.
  bool fusion = false;

  friend bool operator==(const GroupComms&, const GroupComms&) = default;
};

/// One kind of group across the whole world.
struct GroupLayout {
  GroupKind kind = GroupKind::kTp;
  /// Ranks per group.
  int size = 1;
  /// Every group of this kind, in SGLang's creation order; each lists global ranks in group-
  /// rank order. Together they partition 0..world_size-1.
  std::vector<std::vector<int>> groups;
  /// The kind is served by the TP group object itself rather than by its own groups: always
  /// true for `kTp`; for the others, when SGLang aliases them to `_TP`.
  bool is_tp_group = false;
  GroupComms comms;
};

/// The rank layout of all group kinds for one world. Build it with `make_parallel_layout`.
struct ParallelLayout {
  int world_size = 1;
  ParallelConfig config;
  /// Derived widths (see the rules at the top of this file).
  int attn_dp_size = 1;
  int attn_tp_size = 1;
  int moe_tp_size = 1;
  /// Indexed by `GroupKind`.
  std::array<GroupLayout, kGroupKindCount> kinds;

  [[nodiscard]] const GroupLayout& layout(GroupKind kind) const noexcept {
    return kinds[static_cast<int>(kind)];
  }
  /// The ranks of the `kind` group that `rank` belongs to. Throws `Error(kInvalidArgument)`
  /// when `rank` is not in 0..world_size-1.
  [[nodiscard]] const std::vector<int>& group_of(GroupKind kind, int rank) const;
  /// `rank`'s position inside its `kind` group. Same errors as `group_of`.
  [[nodiscard]] int rank_in_group(GroupKind kind, int rank) const;
};

/// The layout SGLang's `initialize_model_parallel` builds for `config` on `world_size` ranks.
/// Pure. Throws `Error(kInvalidArgument)` naming the sizes when a size is below 1, when
/// `world_size != tp_size`, or when tp_size is not divisible as the rules above require (e.g.
/// "tp_size 6 is not divisible by moe_ep_size 4").
[[nodiscard]] ParallelLayout make_parallel_layout(int world_size, const ParallelConfig& config);

}  // namespace tpcomm
