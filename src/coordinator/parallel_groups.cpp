// SPDX-License-Identifier: Apache-2.0
#include "tpcomm/parallel_groups.hpp"

#include <array>
#include <string>

#include "policy/parallel_layout.hpp"

namespace tpcomm {

struct ParallelGroups::Impl {
  std::array<std::unique_ptr<Group>, kGroupKindCount> owned;
  std::array<Group*, kGroupKindCount> groups{};
};

ParallelGroups::ParallelGroups(Bootstrap& world, int device, const ParallelConfig& config,
                               const Options& options)
    : impl_(std::make_unique<Impl>()) {
  const ParallelLayout layout = make_parallel_layout(world.world_size(), config);
  // Every rank builds the kinds in the same order; a kind laid out like TP is TP itself.
  for (GroupKind kind :
       {GroupKind::kTp, GroupKind::kAttnTp, GroupKind::kMoeEp, GroupKind::kMoeTp}) {
    const auto k = static_cast<std::size_t>(kind);
    const GroupLayout& l = layout.layout(kind);
    if (kind != GroupKind::kTp && l.is_tp_group) {
      impl_->groups[k] = impl_->groups[static_cast<std::size_t>(GroupKind::kTp)];
      continue;
    }
    const std::vector<int>& ranks = layout.group_of(kind, world.rank());
    Bootstrap sub = world.split(ranks, to_string(kind));
    // The fusion workspace is part of the custom backend, so a group carrying it builds one.
    const GroupConfig group_config{l.comms.custom_ar || l.comms.fusion, l.comms.nccl,
                                   l.comms.fusion};
    impl_->owned[k] = std::make_unique<Group>(sub, device, options, group_config);
    impl_->groups[k] = impl_->owned[k].get();
  }
}

ParallelGroups::~ParallelGroups() = default;
ParallelGroups::ParallelGroups(ParallelGroups&&) noexcept = default;
ParallelGroups& ParallelGroups::operator=(ParallelGroups&&) noexcept = default;

Group& ParallelGroups::tp() noexcept {
  return *impl_->groups[static_cast<std::size_t>(GroupKind::kTp)];
}
Group& ParallelGroups::attn_tp() noexcept {
  return *impl_->groups[static_cast<std::size_t>(GroupKind::kAttnTp)];
}
Group& ParallelGroups::moe_ep() noexcept {
  return *impl_->groups[static_cast<std::size_t>(GroupKind::kMoeEp)];
}
Group& ParallelGroups::moe_tp() noexcept {
  return *impl_->groups[static_cast<std::size_t>(GroupKind::kMoeTp)];
}

}  // namespace tpcomm
