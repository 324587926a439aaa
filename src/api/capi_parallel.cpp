// SPDX-License-Identifier: Apache-2.0
// The C API's parallel groups: SGLang's rank layouts and the groups of `tpcomm::ParallelGroups`
// (include/tpcomm/tpcomm.h).
#include <array>
#include <cstring>
#include <memory>

#include "api/capi_support.hpp"
#include "policy/parallel_layout.hpp"
#include "tpcomm/parallel_groups.hpp"
#include "tpcomm/tpcomm.h"

using tpcomm::Status;
using tpcomm::capi::guarded;

namespace {

tpcomm::ParallelConfig config_of(const tpcomm_parallel_config* c) {
  TPCOMM_C_REQUIRE(c != nullptr, "config is NULL");
  return {c->tp_size,      c->dp_size,     c->enable_dp_attention != 0,
          c->attn_cp_size, c->moe_ep_size, c->moe_dp_size};
}

tpcomm::GroupKind kind_of(int kind) {
  TPCOMM_C_REQUIRE(kind >= 0 && kind < tpcomm::kGroupKindCount, "kind ", kind,
                   " is not a tpcomm_group_kind");
  return static_cast<tpcomm::GroupKind>(kind);
}

}  // namespace

tpcomm_status tpcomm_parallel_layout(int world_size, const tpcomm_parallel_config* config, int kind,
                                     int rank, int* ranks, size_t capacity, size_t* count,
                                     int* is_tp_group) {
  return guarded("tpcomm_parallel_layout", nullptr, [&] {
    TPCOMM_C_REQUIRE(count != nullptr, "count is NULL");
    const tpcomm::ParallelLayout layout =
        tpcomm::make_parallel_layout(world_size, config_of(config));
    const tpcomm::GroupKind k = kind_of(kind);
    const std::vector<int>& group = layout.group_of(k, rank);
    *count = group.size();
    if (is_tp_group != nullptr) *is_tp_group = layout.layout(k).is_tp_group ? 1 : 0;
    TPCOMM_C_REQUIRE(capacity >= group.size(), "capacity ", capacity, " is below the group's ",
                     group.size(), " ranks (count holds the size needed)");
    TPCOMM_C_REQUIRE(ranks != nullptr, "ranks is NULL");
    std::memcpy(ranks, group.data(), group.size() * sizeof(int));
    return Status::kOk;
  });
}

tpcomm_status tpcomm_parallel_groups_create(tpcomm_bootstrap world, int device,
                                            const tpcomm_parallel_config* config,
                                            tpcomm_group out[4]) {
  if (const char* why = tpcomm::capi::unusable(world, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_parallel_groups_create: world", why));
  return guarded("tpcomm_parallel_groups_create", &world->last_error, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    for (int k = 0; k < tpcomm::kGroupKindCount; ++k) out[k] = nullptr;
    TPCOMM_C_REQUIRE(device >= 0, "device ", device, " is negative");
    const auto groups = std::make_shared<tpcomm::ParallelGroups>(
        world->boot, device, config_of(config), tpcomm::Options::from_env());
    const std::array<tpcomm::Group*, tpcomm::kGroupKindCount> each{
        &groups->tp(), &groups->attn_tp(), &groups->moe_ep(), &groups->moe_tp()};
    std::array<std::unique_ptr<tpcomm_group_s>, tpcomm::kGroupKindCount> handles;
    for (int k = 0; k < tpcomm::kGroupKindCount; ++k) {
      // Each handle keeps `groups` alive (the aliasing constructor): destroyed one by one.
      handles[k] = std::make_unique<tpcomm_group_s>(
          tpcomm_group_s{std::shared_ptr<tpcomm::Group>(groups, each[k]), {}});
    }
    for (int k = 0; k < tpcomm::kGroupKindCount; ++k) {
      out[k] = handles[k].release();
      tpcomm::capi::add_handle(out[k], tpcomm::capi::HandleKind::kGroup);
    }
    return Status::kOk;
  });
}
