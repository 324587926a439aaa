// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "policy/parallel_layout.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

using Groups = std::vector<std::vector<int>>;

// {nccl, custom_ar, fusion}
constexpr GroupComms kNcclAndCustom{true, true, false};
constexpr GroupComms kNcclCustomFusion{true, true, true};
constexpr GroupComms kNcclOnly{true, false, false};
constexpr GroupComms kNcclFusion{true, false, true};
constexpr GroupComms kNoComms{false, false, false};

/// What SGLang builds for one group kind.
struct Expected {
  Groups groups;
  bool is_tp_group;
  GroupComms comms;
};

struct Case {
  const char* name;
  int world;
  ParallelConfig config;
  Expected tp, attn_tp, moe_ep, moe_tp;
};

Groups singletons(int n) {
  Groups g;
  for (int r = 0; r < n; ++r) g.push_back({r});
  return g;
}

Groups all_ranks(int n) {
  std::vector<int> g(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) g[static_cast<std::size_t>(r)] = r;
  return {g};
}

// TP of 8 ranks, carrying a fusion workspace (as ATTN_TP or as the chosen MoE group), and not.
const Expected kTp8{all_ranks(8), true, kNcclCustomFusion};
const Expected kTp8NoFusion{all_ranks(8), true, kNcclAndCustom};

ParallelConfig config(int tp, int dp = 1, bool dp_attention = false, int attn_cp = 1,
                      int moe_ep = 1, int moe_dp = 1) {
  return ParallelConfig{tp, dp, dp_attention, attn_cp, moe_ep, moe_dp};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"tp8 alone", 8, config(8), kTp8, kTp8, {singletons(8), false, kNoComms}, kTp8},
      {"tp8 dp8 dp-attention (attn_tp 1)",
       8,
       config(8, 8, true),
       kTp8,
       {singletons(8), false, kNoComms},
       {singletons(8), false, kNoComms},
       kTp8},
      {"tp8 dp2 dp-attention (attn_tp 4)",
       8,
       config(8, 2, true),
       kTp8,
       {{{0, 1, 2, 3}, {4, 5, 6, 7}}, false, kNcclFusion},
       {singletons(8), false, kNoComms},
       kTp8},
      {"tp8 dp4 dp-attention (attn_tp 2): TP carries the MoE workspace (MoE-TP is TP)",
       8,
       config(8, 4, true),
       kTp8,
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclFusion},
       {singletons(8), false, kNoComms},
       kTp8},
      {"tp8 dp4 dp-attention moe_ep8 (attn_tp 2): TP carries the MoE workspace (EP is TP)",
       8,
       config(8, 4, true, 1, 8),
       kTp8,
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclFusion},
       kTp8,
       {singletons(8), false, kNoComms}},
      {"tp8 dp4 dp-attention moe_ep4 (attn_tp 2, moe_tp 2): TP carries none",
       8,
       config(8, 4, true, 1, 4),
       kTp8NoFusion,
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclFusion},
       {{{0, 2, 4, 6}, {1, 3, 5, 7}}, false, kNcclFusion},
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclOnly}},
      {"tp8 dp2 without dp-attention: replicas do not split TP",
       8,
       config(8, 2, false),
       kTp8,
       kTp8,
       {singletons(8), false, kNoComms},
       kTp8},
      {"tp4 moe_ep4: EP is TP",
       4,
       config(4, 1, false, 1, 4),
       {all_ranks(4), true, kNcclCustomFusion},
       {all_ranks(4), true, kNcclCustomFusion},
       {all_ranks(4), true, kNcclCustomFusion},
       {singletons(4), false, kNoComms}},
      {"tp8 moe_ep8: EP is TP",
       8,
       config(8, 1, false, 1, 8),
       kTp8,
       kTp8,
       kTp8,
       {singletons(8), false, kNoComms}},
      {"tp8 moe_ep4 (moe_tp 2)",
       8,
       config(8, 1, false, 1, 4),
       kTp8,
       kTp8,
       {{{0, 2, 4, 6}, {1, 3, 5, 7}}, false, kNcclFusion},
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclOnly}},
      {"tp8 moe_ep2 (moe_tp 4)",
       8,
       config(8, 1, false, 1, 2),
       kTp8,
       kTp8,
       {{{0, 4}, {1, 5}, {2, 6}, {3, 7}}, false, kNcclFusion},
       {{{0, 1, 2, 3}, {4, 5, 6, 7}}, false, kNcclOnly}},
      {"tp8 moe_ep2 moe_dp2 (moe_tp 2)",
       8,
       config(8, 1, false, 1, 2, 2),
       kTp8,
       kTp8,
       {{{0, 2}, {1, 3}, {4, 6}, {5, 7}}, false, kNcclFusion},
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclOnly}},
      {"tp8 attn_cp2 (attn_tp 4)",
       8,
       config(8, 1, false, 2),
       kTp8,
       {{{0, 1, 2, 3}, {4, 5, 6, 7}}, false, kNcclFusion},
       {singletons(8), false, kNoComms},
       kTp8},
      {"tp8 dp2 dp-attention attn_cp2 (attn_tp 2)",
       8,
       config(8, 2, true, 2),
       kTp8,
       {{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, false, kNcclFusion},
       {singletons(8), false, kNoComms},
       kTp8},
      // The example in the docstring of SGLang's initialize_model_parallel.
      {"tp8 attn_cp2 moe_dp2 moe_ep4 (moe_tp 1)",
       8,
       config(8, 1, false, 2, 4, 2),
       kTp8NoFusion,
       {{{0, 1, 2, 3}, {4, 5, 6, 7}}, false, kNcclFusion},
       {{{0, 1, 2, 3}, {4, 5, 6, 7}}, false, kNcclFusion},
       {singletons(8), false, kNoComms}},
      {"tp2 dp2 dp-attention moe_ep2",
       2,
       config(2, 2, true, 1, 2),
       {all_ranks(2), true, kNcclCustomFusion},
       {singletons(2), false, kNoComms},
       {all_ranks(2), true, kNcclCustomFusion},
       {singletons(2), false, kNoComms}},
      {"tp1: nothing to communicate",
       1,
       config(1),
       {all_ranks(1), true, kNoComms},
       {all_ranks(1), true, kNoComms},
       {all_ranks(1), true, kNoComms},
       {all_ranks(1), true, kNoComms}},
  };
  return kCases;
}

void expect_kind(const ParallelLayout& l, GroupKind kind, const Expected& want) {
  SCOPED_TRACE(std::string(to_string(kind)));
  const GroupLayout& g = l.layout(kind);
  EXPECT_EQ(g.kind, kind);
  EXPECT_EQ(g.groups, want.groups);
  EXPECT_EQ(g.is_tp_group, want.is_tp_group);
  EXPECT_EQ(g.comms, want.comms);
  ASSERT_FALSE(want.groups.empty());
  EXPECT_EQ(g.size, static_cast<int>(want.groups.front().size()));
}

TEST(ParallelLayout, MatchesSglangGroups) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ParallelLayout l = make_parallel_layout(c.world, c.config);
    EXPECT_EQ(l.world_size, c.world);
    expect_kind(l, GroupKind::kTp, c.tp);
    expect_kind(l, GroupKind::kAttnTp, c.attn_tp);
    expect_kind(l, GroupKind::kMoeEp, c.moe_ep);
    expect_kind(l, GroupKind::kMoeTp, c.moe_tp);
  }
}

// An independent check of every case against SGLang's per-rank arithmetic (the scheduler's
// rank decomposition): tp_rank = (attn_dp * attn_cp + cp) * attn_tp + attn_tp_rank for
// attention, and tp_rank = (moe_dp * moe_ep + ep) * moe_tp + moe_tp_rank for MoE. Two ranks share
// an ATTN_TP group when they agree on everything but attn_tp_rank, an EP group when they agree on
// everything but ep, an MoE-TP group when they agree on everything but moe_tp_rank.
TEST(ParallelLayout, AgreesWithTheRankDecomposition) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ParallelLayout l = make_parallel_layout(c.world, c.config);
    const int attn_tp = l.attn_tp_size;
    const int moe_tp = l.moe_tp_size;
    const int moe_ep = c.config.moe_ep_size;
    EXPECT_EQ(attn_tp * l.attn_dp_size * c.config.attn_cp_size, c.config.tp_size);
    EXPECT_EQ(moe_tp * moe_ep * c.config.moe_dp_size, c.config.tp_size);
    for (int r = 0; r < c.world; ++r) {
      for (int s = 0; s < c.world; ++s) {
        bool same_attn_tp = r / attn_tp == s / attn_tp;
        bool same_moe_ep =
            r % moe_tp == s % moe_tp && r / (moe_tp * moe_ep) == s / (moe_tp * moe_ep);
        bool same_moe_tp = r / moe_tp == s / moe_tp;
        auto in = [&](GroupKind k) {
          const auto& g = l.group_of(k, r);
          return std::find(g.begin(), g.end(), s) != g.end();
        };
        EXPECT_TRUE(in(GroupKind::kTp)) << r << " " << s;
        EXPECT_EQ(in(GroupKind::kAttnTp), same_attn_tp) << r << " " << s;
        EXPECT_EQ(in(GroupKind::kMoeEp), same_moe_ep) << r << " " << s;
        EXPECT_EQ(in(GroupKind::kMoeTp), same_moe_tp) << r << " " << s;
      }
      EXPECT_EQ(l.rank_in_group(GroupKind::kTp, r), r);
      EXPECT_EQ(l.rank_in_group(GroupKind::kAttnTp, r), r % attn_tp);
      EXPECT_EQ(l.rank_in_group(GroupKind::kMoeEp, r), (r / moe_tp) % moe_ep);
      EXPECT_EQ(l.rank_in_group(GroupKind::kMoeTp, r), r % moe_tp);
    }
  }
}

TEST(ParallelLayout, GroupsPartitionTheWorld) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ParallelLayout l = make_parallel_layout(c.world, c.config);
    for (const GroupLayout& g : l.kinds) {
      std::vector<int> seen;
      for (const auto& group : g.groups) {
        EXPECT_EQ(static_cast<int>(group.size()), g.size);
        seen.insert(seen.end(), group.begin(), group.end());
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int> want(static_cast<std::size_t>(c.world));
      for (int r = 0; r < c.world; ++r) want[static_cast<std::size_t>(r)] = r;
      EXPECT_EQ(seen, want) << to_string(g.kind);
      // Only the TP group (or a kind aliased to it) carries the custom all-reduce.
      EXPECT_EQ(g.comms.custom_ar, g.is_tp_group && g.size > 1) << to_string(g.kind);
    }
  }
}

// SGLang's tagging rule for the fusion workspaces, checked on every case: ATTN_TP carries one;
// exactly one MoE group (EP when moe_ep > 1, else MoE-TP) carries the other; the other MoE group
// none; a group of one rank none; TP only as one of those groups; kinds aliased to TP report
// TP's communicators, being the same object.
TEST(ParallelLayout, FusionWorkspaceRuleHoldsForEveryCase) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    ParallelLayout l = make_parallel_layout(c.world, c.config);
    const GroupLayout& tp = l.layout(GroupKind::kTp);
    const GroupLayout& attn = l.layout(GroupKind::kAttnTp);
    const bool ep_chosen = c.config.moe_ep_size > 1;
    const GroupLayout& moe = l.layout(ep_chosen ? GroupKind::kMoeEp : GroupKind::kMoeTp);
    const GroupLayout& other_moe = l.layout(ep_chosen ? GroupKind::kMoeTp : GroupKind::kMoeEp);
    EXPECT_EQ(attn.comms.fusion, attn.size > 1);
    EXPECT_EQ(moe.comms.fusion, moe.size > 1);
    EXPECT_FALSE(other_moe.comms.fusion);
    EXPECT_EQ(tp.comms.fusion,
              (attn.is_tp_group && attn.size > 1) || (moe.is_tp_group && moe.size > 1));
    for (const GroupLayout& g : l.kinds) {
      if (g.size < 2) {
        EXPECT_EQ(g.comms, kNoComms) << to_string(g.kind);
      }
      if (g.is_tp_group) {
        EXPECT_EQ(g.comms, tp.comms) << to_string(g.kind);
      }
    }
  }
}

// The layouts of SGLang's process groups, one by one: who carries a fusion workspace.
TEST(ParallelLayout, FusionWorkspacePlacement) {
  auto fusion = [](const ParallelLayout& l, GroupKind k) { return l.layout(k).comms.fusion; };
  {
    SCOPED_TRACE("tp=ep=4: TP, ATTN_TP and EP are one object, which carries one workspace");
    ParallelLayout l = make_parallel_layout(4, config(4, 1, false, 1, 4));
    ASSERT_TRUE(l.layout(GroupKind::kAttnTp).is_tp_group);
    ASSERT_TRUE(l.layout(GroupKind::kMoeEp).is_tp_group);
    EXPECT_TRUE(fusion(l, GroupKind::kTp));
    EXPECT_FALSE(fusion(l, GroupKind::kMoeTp));
  }
  {
    SCOPED_TRACE("tp8 ep8: EP is TP");
    ParallelLayout l = make_parallel_layout(8, config(8, 1, false, 1, 8));
    EXPECT_TRUE(fusion(l, GroupKind::kTp));
    EXPECT_TRUE(fusion(l, GroupKind::kMoeEp));
    EXPECT_FALSE(fusion(l, GroupKind::kMoeTp));
  }
  {
    SCOPED_TRACE("tp8 ep4 (moe_tp 2): EP carries the MoE workspace, MoE-TP none");
    ParallelLayout l = make_parallel_layout(8, config(8, 1, false, 1, 4));
    EXPECT_TRUE(fusion(l, GroupKind::kTp));  // as ATTN_TP
    EXPECT_TRUE(fusion(l, GroupKind::kMoeEp));
    EXPECT_FALSE(l.layout(GroupKind::kMoeEp).is_tp_group);
    EXPECT_FALSE(fusion(l, GroupKind::kMoeTp));
    EXPECT_EQ(l.layout(GroupKind::kMoeEp).comms, kNcclFusion);
  }
  {
    SCOPED_TRACE("tp8 dp4 dp-attention ep4: ATTN_TP (2 ranks) and EP carry, TP none");
    ParallelLayout l = make_parallel_layout(8, config(8, 4, true, 1, 4));
    EXPECT_EQ(l.attn_tp_size, 2);
    EXPECT_TRUE(fusion(l, GroupKind::kAttnTp));
    EXPECT_TRUE(fusion(l, GroupKind::kMoeEp));
    EXPECT_FALSE(fusion(l, GroupKind::kMoeTp));
    EXPECT_FALSE(fusion(l, GroupKind::kTp));
  }
  {
    SCOPED_TRACE("tp8 dp4 dp-attention ep1: ATTN_TP carries; TP carries as MoE-TP");
    ParallelLayout l = make_parallel_layout(8, config(8, 4, true));
    EXPECT_TRUE(fusion(l, GroupKind::kAttnTp));
    EXPECT_FALSE(l.layout(GroupKind::kAttnTp).is_tp_group);
    EXPECT_TRUE(l.layout(GroupKind::kMoeTp).is_tp_group);
    EXPECT_TRUE(fusion(l, GroupKind::kTp));
    EXPECT_FALSE(fusion(l, GroupKind::kMoeEp));
  }
  {
    SCOPED_TRACE("tp8 ep1: MoE-TP is TP, which also is ATTN_TP");
    ParallelLayout l = make_parallel_layout(8, config(8));
    EXPECT_TRUE(l.layout(GroupKind::kMoeTp).is_tp_group);
    EXPECT_TRUE(fusion(l, GroupKind::kTp));
    EXPECT_TRUE(fusion(l, GroupKind::kMoeTp));
    EXPECT_FALSE(fusion(l, GroupKind::kMoeEp));
  }
  {
    SCOPED_TRACE("tp8 dp8 dp-attention ep8: attention groups of one rank carry nothing");
    ParallelLayout l = make_parallel_layout(8, config(8, 8, true, 1, 8));
    EXPECT_FALSE(fusion(l, GroupKind::kAttnTp));
    EXPECT_TRUE(fusion(l, GroupKind::kMoeEp));
    EXPECT_TRUE(fusion(l, GroupKind::kTp));
  }
  {
    SCOPED_TRACE("tp1: nothing");
    ParallelLayout l = make_parallel_layout(1, config(1));
    for (const GroupLayout& g : l.kinds) EXPECT_FALSE(g.comms.fusion) << to_string(g.kind);
  }
}

TEST(ParallelLayout, GroupOfRejectsRanksOutsideTheWorld) {
  ParallelLayout l = make_parallel_layout(8, config(8));
  EXPECT_EQ(l.group_of(GroupKind::kMoeEp, 5), (std::vector<int>{5}));
  for (int r : {-1, 8, 100}) {
    try {
      (void)l.group_of(GroupKind::kTp, r);
      ADD_FAILURE() << "rank " << r << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r)), std::string::npos)
          << e.what();
    }
  }
}

TEST(ParallelLayout, InvalidCombinationsAreClearErrors) {
  struct Bad {
    int world;
    ParallelConfig config;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {6, config(6, 1, false, 1, 4), "tp_size 6 is not divisible by moe_ep_size 4"},
      {8, config(8, 1, false, 1, 16), "tp_size 8 is not divisible by moe_ep_size 16"},
      {8, config(8, 1, false, 1, 1, 3), "tp_size 8 is not divisible by moe_dp_size 3"},
      {8, config(8, 1, false, 1, 4, 4),
       "tp_size 8 is not divisible by moe_ep_size 4 * moe_dp_size 4"},
      {8, config(8, 3, true), "tp_size 8 is not divisible by dp_size 3 (DP attention)"},
      {8, config(8, 16, true), "tp_size 8 is not divisible by dp_size 16"},
      {8, config(8, 1, false, 3), "tp_size 8 is not divisible by attn_cp_size 3"},
      {8, config(8, 4, true, 4), "tp_size 8 is not divisible by dp_size 4 * attn_cp_size 4"},
      {16, config(8), "world_size 16 != tp_size 8"},
      {4, config(8), "world_size 4 != tp_size 8"},
      {0, config(8), "world_size 0 must be at least 1"},
      {8, config(0), "tp_size 0 must be at least 1"},
      {8, config(8, 0), "dp_size 0 must be at least 1"},
      {8, config(8, 1, false, 0), "attn_cp_size 0 must be at least 1"},
      {8, config(8, 1, false, 1, -2), "moe_ep_size -2 must be at least 1"},
      {8, config(8, 1, false, 1, 1, 0), "moe_dp_size 0 must be at least 1"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    try {
      (void)make_parallel_layout(b.world, b.config);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
    }
  }
  // A dp_size that does not divide tp is fine without DP attention: replicas are separate worlds.
  EXPECT_NO_THROW((void)make_parallel_layout(8, config(8, 3, false)));
}

}  // namespace
}  // namespace tpcomm
