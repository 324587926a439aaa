// SPDX-License-Identifier: Apache-2.0
// The exchanges' copy regions (src/backends/exchange_plan.hpp) against hand-computed tables, and
// the exchange's selector.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backends/exchange_plan.hpp"
#include "tune/selector.hpp"
#include "tune/tuner.hpp"

namespace tpcomm {
namespace {

using kernels::CopyRegion;

bool same(const CopyRegion& a, const CopyRegion& b) {
  return a.src_offset == b.src_offset && a.src_pitch == b.src_pitch &&
         a.dst_offset == b.dst_offset && a.dst_pitch == b.dst_pitch && a.rows == b.rows &&
         a.row_bytes == b.row_bytes;
}

TEST(ExchangePlan, AllGatherPlacesEachInputAtItsRank) {
  const ExchangePlan p = plan_all_gather(100, 3, 1);
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(same(p.from[s], {0, 100, s * 100, 100, 1, 100})) << s;
  EXPECT_EQ(p.input_bytes, 100);
  EXPECT_EQ(p.largest_input, 100);
}

TEST(ExchangePlan, GatherPlacesEachInputAtItsRankOnTheRootOnly) {
  const ExchangePlan root = plan_gather(100, 3, 1, 1);
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(same(root.from[s], {0, 100, s * 100, 100, 1, 100})) << s;
  const ExchangePlan other = plan_gather(100, 3, 2, 1);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(other.from[s].rows, 0) << s;
  EXPECT_TRUE(same(other.to[1], {0, 100, 200, 100, 1, 100}));
  EXPECT_EQ(other.to[0].rows, 0);
  EXPECT_EQ(other.input_bytes, 100);
  EXPECT_EQ(other.largest_output, 300);
}

TEST(ExchangePlan, AllToAllTakesThisRanksChunk) {
  const ExchangePlan p = plan_all_to_all(120, 4, 2);  // chunks of 30 bytes
  for (int s = 0; s < 4; ++s) EXPECT_TRUE(same(p.from[s], {60, 30, s * 30, 30, 1, 30})) << s;
  EXPECT_EQ(p.input_bytes, 120);
}

TEST(ExchangePlan, AllToAllWithCounts) {
  // 3 ranks; counts[s][d] elements of 2 bytes from s to d.
  const std::vector<std::int64_t> counts{1, 2, 3,  //
                                         4, 0, 6,  //
                                         7, 8, 9};
  const ExchangePlan p = plan_all_to_all(counts, 2, 3, 1);
  // Rank 1 receives 2 from rank 0 (after rank 0's 1 for rank 0), 0 from itself, 8 from rank 2.
  EXPECT_TRUE(same(p.from[0], {2, 4, 0, 4, 1, 4}));
  EXPECT_TRUE(same(p.from[1], {8, 0, 4, 0, 1, 0}));
  EXPECT_TRUE(same(p.from[2], {14, 16, 4, 16, 1, 16}));
  EXPECT_EQ(p.input_bytes, (4 + 0 + 6) * 2);
  EXPECT_EQ(p.largest_input, (7 + 8 + 9) * 2);
}

TEST(ExchangePlan, LmHeadWritesEachShardAtItsColumns) {
  // 4 ranks, rows {2, 0, 3, 1} (T = 6), shards of 10 columns, vocabulary 33 (padded to 40),
  // 2-byte elements. Rank 2's rows are rows 2..4 of every shard.
  const std::int64_t rows[] = {2, 0, 3, 1};
  const ExchangePlan p = plan_lm_head(LmHeadLayout::counts(rows), 10, 33, 2, 4, 2);
  EXPECT_TRUE(same(p.from[0], {40, 20, 0, 66, 3, 20}));
  EXPECT_TRUE(same(p.from[1], {40, 20, 20, 66, 3, 20}));
  EXPECT_TRUE(same(p.from[2], {40, 20, 40, 66, 3, 20}));
  EXPECT_TRUE(same(p.from[3], {40, 20, 60, 66, 3, 6}));  // columns 30..32 only
  EXPECT_EQ(p.input_bytes, 6 * 20);
  EXPECT_EQ(p.largest_input, 6 * 20);
  // A rank without rows copies nothing but still stages its shard for the others.
  const ExchangePlan none = plan_lm_head(LmHeadLayout::counts(rows), 10, 33, 2, 4, 1);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(none.from[s].rows, 0);
  EXPECT_EQ(none.input_bytes, 6 * 20);
}

TEST(ExchangePlan, LmHeadEqualLayoutAndEmptyShards) {
  // Vocabulary 1 over 8 ranks in shards of 8: only shard 0 has a column.
  const ExchangePlan p = plan_lm_head(LmHeadLayout::equal(3), 8, 1, 4, 8, 5);
  EXPECT_TRUE(same(p.from[0], {15 * 32, 32, 0, 4, 3, 4}));
  for (int s = 1; s < 8; ++s) EXPECT_EQ(p.from[s].row_bytes, 0) << s;
  EXPECT_EQ(lm_head_columns(0, 16160, 129280), 16160);
  EXPECT_EQ(lm_head_columns(7, 16160, 129280), 16160);
  EXPECT_EQ(lm_head_columns(7, 19008, 152000), 152000 - 7 * 19008);
  EXPECT_EQ(lm_head_columns(8, 16160, 129280), 0);
}

constexpr std::int64_t kCounts[] = {1, 2, 3, 4, 0, 6, 7, 8, 10};

// Every plan, for every pair of ranks: what rank d takes from rank s (d's `from[s]`) is what s
// sends d (s's `to[d]`), and the push form's slot is the same on every rank.
TEST(ExchangePlan, EveryRankSendsWhatItsPeersTake) {
  struct Case {
    const char* name;
    int world;
    ExchangePlan (*plan)(int world, int rank);
    std::int64_t push_slot;
  };
  const Case cases[] = {
      {"all_gather", 5, [](int w, int r) { return plan_all_gather(100, w, r); }, 208},
      {"all_gather odd", 3, [](int w, int r) { return plan_all_gather(6, w, r); }, 0},
      {"gather", 4, [](int w, int r) { return plan_gather(100, w, r, 2); }, 208},
      {"all_to_all", 4, [](int w, int r) { return plan_all_to_all(128, w, r); }, 64},
      {"all_to_allv", 3, [](int w, int r) { return plan_all_to_all(kCounts, 4, w, r); },
       64},  // the most any rank sends another: 8 elements of 4 bytes, in 4 lines
      {"all_to_allv 2-byte", 3, [](int w, int r) { return plan_all_to_all(kCounts, 2, w, r); },
       0},  // one element of 2 bytes is not a word
      {"lm_head", 4,
       [](int w, int r) {
         const std::int64_t rows_of[] = {2, 0, 3, 1};
         return plan_lm_head(LmHeadLayout::counts(rows_of), 10, 36, 2, w, r);
       },
       128},  // rank 2's 3 rows of 20 bytes: 60 bytes, 8 lines
      {"lm_head odd vocabulary", 4,
       [](int w, int r) {
         const std::int64_t rows_of[] = {2, 0, 3, 1};
         return plan_lm_head(LmHeadLayout::counts(rows_of), 10, 33, 2, w, r);
       },
       0},  // the last shard's rows are 6 bytes
  };
  for (const Case& c : cases) {
    for (int d = 0; d < c.world; ++d) {
      const ExchangePlan taker = c.plan(c.world, d);
      EXPECT_EQ(taker.push_slot_bytes, c.push_slot) << c.name << " rank " << d;
      std::int64_t region = 0;  // the most any rank sends another, from every rank's own plan
      for (int s = 0; s < c.world; ++s) {
        const ExchangePlan sender = c.plan(c.world, s);
        EXPECT_TRUE(same(taker.from[s], sender.to[d]))
            << c.name << ": rank " << d << " from rank " << s;
        for (int r = 0; r < c.world; ++r)
          if (r != s) region = std::max(region, sender.to[r].rows * sender.to[r].row_bytes);
      }
      EXPECT_EQ(taker.largest_region, region) << c.name << " rank " << d;
    }
  }
}

SelectorCaps exchange_caps(int world) {
  SelectorCaps caps;
  caps.world_size = world;
  caps.custom_available = true;
  caps.max_bytes = 8 << 20;
  caps.max_blocks = 24;
  caps.exchange_max_bytes = 32 << 20;
  return caps;
}

/// `select_exchange` of a call that cannot push (rows not whole words).
ExchangeChoice pull_only(std::int64_t input, std::int64_t output, const SelectorCaps& caps,
                         Pinned pinned, const TuneTable* table) {
  return select_exchange({input, output, input, 0}, caps, pinned, {}, table);
}

TEST(ExchangeSelector, ServesWhatTheStagingHolds) {
  const SelectorCaps caps = exchange_caps(8);
  EXPECT_EQ(pull_only(1, 1, caps, {}, nullptr), (ExchangeChoice{ExchangeAlgo::kPull, 1, 512}));
  EXPECT_EQ(pull_only(64 << 10, 64 << 10, caps, {}, nullptr),
            (ExchangeChoice{ExchangeAlgo::kPull, 2, 512}));
  EXPECT_EQ(pull_only(32 << 20, 32 << 20, caps, {}, nullptr),
            (ExchangeChoice{ExchangeAlgo::kPull, 24, 512}));
  EXPECT_EQ(pull_only((32 << 20) + 1, (32 << 20) + 1, caps, {}, nullptr).algo, ExchangeAlgo::kNone);
  EXPECT_EQ(pull_only(0, 0, caps, {}, nullptr).algo, ExchangeAlgo::kNone);
  // "nccl" pins the exchange too; an all-reduce algorithm does not.
  EXPECT_EQ(pull_only(1024, 1024, caps, Algo::kNone, nullptr).algo, ExchangeAlgo::kNone);
  EXPECT_EQ(pull_only(1024, 1024, caps, Algo::kLamport, nullptr).algo, ExchangeAlgo::kPull);
  SelectorCaps off = caps;
  off.custom_available = false;
  EXPECT_EQ(pull_only(1024, 1024, off, {}, nullptr).algo, ExchangeAlgo::kNone);
  SelectorCaps huge = caps;
  huge.exchange_max_bytes = std::int64_t{8} << 30;
  EXPECT_EQ(pull_only(std::int64_t{4} << 30, std::int64_t{4} << 30, huge, {}, nullptr).algo,
            ExchangeAlgo::kNone);
}

TEST(ExchangeSelector, TunedTableDecidesWithinTheCaps) {
  const SelectorCaps caps = exchange_caps(8);
  const TuneKey key{"NVIDIA H200", 8, "one-gpu", 12040, 22703, "0.1.0"};
  const TuneTable table(key, {}, {},
                        {{1 << 20, ExchangeChoice{ExchangeAlgo::kPull, 64, 1024}, 10.0},
                         {2 << 20, ExchangeChoice{}, 12.0}});
  // The tuned shape, with blocks clamped to the group's limit.
  EXPECT_EQ(pull_only(1000, 1000, caps, {}, &table),
            (ExchangeChoice{ExchangeAlgo::kPull, 24, 1024}));
  // `none`: NCCL won that bucket.
  EXPECT_EQ(pull_only(2 << 20, 2 << 20, caps, {}, &table).algo, ExchangeAlgo::kNone);
  // Past the table, or a table of another world size: the built-in choice.
  EXPECT_EQ(pull_only((2 << 20) + 1, (2 << 20) + 1, caps, {}, &table),
            pull_only((2 << 20) + 1, (2 << 20) + 1, caps, {}, nullptr));
  const TuneTable other(TuneKey{"NVIDIA H200", 4, "one-gpu", 12040, 22703, "0.1.0"}, {}, {},
                        table.exchange_entries());
  EXPECT_EQ(pull_only(1000, 1000, caps, {}, &other), pull_only(1000, 1000, caps, {}, nullptr));
  // "nccl" wins over the table.
  EXPECT_EQ(pull_only(1000, 1000, caps, Algo::kNone, &table).algo, ExchangeAlgo::kNone);
}

TEST(ExchangeSelector, PushWherePinnedOrTunedAndItFits) {
  SelectorCaps caps = exchange_caps(8);
  caps.lamport_max_bytes = 512 << 10;
  auto pick = [&](std::int64_t input, std::int64_t output, std::int64_t slot,
                  PinnedExchange pinned = {}, const TuneTable* table = nullptr) {
    return select_exchange({input, output, slot / 2, slot}, caps, {}, pinned, table);
  };
  // The built-in choice at 8 ranks: the push form up to 32 KiB a peer (NOTE [exchange launch]:
  // a 128-thread block per KiB received).
  EXPECT_EQ(pick(1024, 8192, 2048), (ExchangeChoice{ExchangeAlgo::kPush, 8, 128}));
  EXPECT_EQ(pick(64 << 10, 512 << 10, 128 << 10).algo, ExchangeAlgo::kPull);
  // Pinned: wherever it fits, with exchange_launch's shape; elsewhere the built-in choice
  // (rows not whole words, pieces past the slots, a group without Lamport buffers).
  EXPECT_EQ(pick(1024, 8192, 2048, ExchangeAlgo::kPush),
            (ExchangeChoice{ExchangeAlgo::kPush, 8, 128}));
  EXPECT_EQ(pick(64 << 10, 512 << 10, 128 << 10, ExchangeAlgo::kPush),
            (ExchangeChoice{ExchangeAlgo::kPush, 24, 512}));
  EXPECT_EQ(pick(1 << 20, 1 << 20, 256 << 10, ExchangeAlgo::kPush).algo, ExchangeAlgo::kPush);
  EXPECT_EQ(pick(1024, 8192, 0, ExchangeAlgo::kPush).algo, ExchangeAlgo::kPull);
  EXPECT_EQ(pick(1024, 8192, (512 << 10) + 16, ExchangeAlgo::kPush).algo, ExchangeAlgo::kPull);
  SelectorCaps none = caps;
  none.lamport_max_bytes = 0;
  EXPECT_EQ(select_exchange({1024, 8192, 1024, 2048}, none, {}, ExchangeAlgo::kPush, nullptr).algo,
            ExchangeAlgo::kPull);
  EXPECT_EQ(pick(1024, 8192, 2048, ExchangeAlgo::kPull).algo, ExchangeAlgo::kPull);
  // "nccl" wins over a pinned exchange.
  EXPECT_EQ(
      select_exchange({1024, 8192, 1024, 2048}, caps, Algo::kNone, ExchangeAlgo::kPush, nullptr)
          .algo,
      ExchangeAlgo::kNone);
  // A tuned push where the call cannot push: the built-in choice.
  const TuneKey key{"NVIDIA H200", 8, "one-gpu", 12040, 22703, "0.1.0"};
  const TuneTable table(key, {}, {}, {{1 << 20, ExchangeChoice{ExchangeAlgo::kPush, 4, 256}, 5.0}});
  EXPECT_EQ(pick(1024, 8192, 2048, {}, &table), (ExchangeChoice{ExchangeAlgo::kPush, 4, 256}));
  EXPECT_EQ(pick(1024, 8192, 0, {}, &table), pick(1024, 8192, 0));
  EXPECT_EQ(to_string(PinnedExchange{}), "auto");
  PinnedExchange parsed;
  EXPECT_TRUE(parse_pinned_exchange("push", &parsed));
  EXPECT_EQ(parsed, ExchangeAlgo::kPush);
  EXPECT_TRUE(parse_pinned_exchange("auto", &parsed));
  EXPECT_FALSE(parsed.has_value());
  EXPECT_FALSE(parse_pinned_exchange("lamport", &parsed));
}

// NOTE [exchange launch]: the push form takes 128-thread blocks, one per 1, 2 or 4 KiB received,
// the first that keeps them within 32 blocks and the group's limit; past that, and in the pull
// form, 512-thread blocks (one per 4 KiB pushed, a line a thread, or 32 KiB pulled).
TEST(ExchangeSelector, PushLaunchShape) {
  SelectorCaps caps = exchange_caps(8);  // at most 24 blocks
  auto push = [&](std::int64_t output) {
    return exchange_launch(ExchangeAlgo::kPush, output, caps);
  };
  EXPECT_EQ(push(16), (ExchangeChoice{ExchangeAlgo::kPush, 1, 128}));
  EXPECT_EQ(push(1024), (ExchangeChoice{ExchangeAlgo::kPush, 1, 128}));
  EXPECT_EQ(push(1025), (ExchangeChoice{ExchangeAlgo::kPush, 2, 128}));
  EXPECT_EQ(push(24 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 24, 128}));
  EXPECT_EQ(push(32 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 16, 128}));
  EXPECT_EQ(push(96 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 24, 128}));
  EXPECT_EQ(push(128 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 24, 512}));
  EXPECT_EQ(push(1 << 20), (ExchangeChoice{ExchangeAlgo::kPush, 24, 512}));
  caps.max_blocks = 64;
  EXPECT_EQ(push(32 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 32, 128}));
  EXPECT_EQ(push(128 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 32, 128}));
  EXPECT_EQ(push(160 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 40, 512}));
  EXPECT_EQ(push(256 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 64, 512}));
  caps.max_blocks = 1;
  EXPECT_EQ(push(8 << 10), (ExchangeChoice{ExchangeAlgo::kPush, 1, 512}));
  EXPECT_EQ(push(512), (ExchangeChoice{ExchangeAlgo::kPush, 1, 128}));
  caps.max_blocks = 64;
  EXPECT_EQ(exchange_launch(ExchangeAlgo::kPull, 8 << 10, caps),
            (ExchangeChoice{ExchangeAlgo::kPull, 1, 512}));
  EXPECT_EQ(exchange_launch(ExchangeAlgo::kPull, 128 << 10, caps),
            (ExchangeChoice{ExchangeAlgo::kPull, 4, 512}));
}

// Unpinned and untuned, the push form up to its built-in bounds by the most one rank sends
// another (512 KiB at 2 ranks, 64 KiB at 3 and 4, 32 KiB from 5), where it fits the slots.
TEST(ExchangeSelector, BuiltInPushUpToItsBoundsByTheLargestRegion) {
  for (int world : {2, 3, 4, 5, 8}) {
    SelectorCaps caps = exchange_caps(world);
    caps.lamport_max_bytes = 2 << 20;
    const std::int64_t bound = world == 2 ? 512 << 10 : world <= 4 ? 64 << 10 : 32 << 10;
    auto pick = [&](std::int64_t region) {
      return select_exchange({region * world, region * world, region,
                              kernels::exchange_push_slot_bytes(region)},
                             caps, {}, {}, nullptr)
          .algo;
    };
    SCOPED_TRACE(world);
    EXPECT_EQ(pick(1024), bound > 0 ? ExchangeAlgo::kPush : ExchangeAlgo::kPull);
    if (bound > 0) {
      EXPECT_EQ(pick(bound), ExchangeAlgo::kPush);
    }
    EXPECT_EQ(pick(bound + 1024), ExchangeAlgo::kPull);
    // Rows that are not whole words cannot push, whatever their size.
    EXPECT_EQ(select_exchange({4096, 4096, 1022, 0}, caps, {}, {}, nullptr).algo,
              ExchangeAlgo::kPull);
  }
}

TEST(ExchangeTuner, CandidatesStayWithinTheLimits) {
  SelectorCaps caps = exchange_caps(4);
  caps.max_blocks = 12;
  const auto small = exchange_candidates(512, caps);
  ASSERT_FALSE(small.empty());
  for (const ExchangeChoice& c : small) {
    EXPECT_EQ(c.algo, ExchangeAlgo::kPull);  // no Lamport buffers in these caps
    EXPECT_LE(c.blocks, 2);  // 32 accesses: one block of any size, and one step past it
  }
  // With Lamport slots, the push form where the pieces fit them.
  caps.lamport_max_bytes = 64 << 10;
  auto has_push = [](const std::vector<ExchangeChoice>& v) {
    return std::any_of(v.begin(), v.end(),
                       [](const ExchangeChoice& c) { return c.algo == ExchangeAlgo::kPush; });
  };
  EXPECT_TRUE(has_push(exchange_candidates(128 << 10, caps)));   // pieces of 32 KiB
  EXPECT_FALSE(has_push(exchange_candidates(256 << 10, caps)));  // 64 KiB: 128 KiB of lines
  caps.lamport_max_bytes = 0;
  const auto large = exchange_candidates(8 << 20, caps);
  int most = 0;
  for (std::size_t i = 0; i < large.size(); ++i) {
    most = std::max(most, large[i].blocks);
    if (i > 0) {
      EXPECT_LE(large[i - 1].blocks, large[i].blocks) << "fewest blocks first";
    }
  }
  EXPECT_EQ(most, 12);
}

TEST(ExchangeRegistry, NamesAreUniqueAndApartFromTheAllReduce) {
  for (const ExchangeInfo& e : kExchangeAlgorithms) {
    EXPECT_EQ(info(e.algo).name, e.name);
    EXPECT_EQ(to_string(e.algo), e.name);
    EXPECT_GE(e.max_blocks, 1);
    EXPECT_LE(e.max_blocks, kMaxBlocks);
    EXPECT_FALSE(parse_algo(e.name).has_value()) << e.name << " is also an all-reduce name";
  }
  EXPECT_EQ(to_string(ExchangeAlgo::kNone), "none");
}

}  // namespace
}  // namespace tpcomm
