// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "ipc/layout.hpp"
#include "kernels/kernels.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/types.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * 1024;

// The registry's built-in bounds of the Lamport kernel, for 5-8 ranks and for up to 4.
constexpr std::int64_t kLamportMaxBytes = info(Algo::kLamport).built_in.more_ranks;
constexpr std::int64_t kLamportMaxBytesUpTo4Ranks = info(Algo::kLamport).built_in.up_to_4_ranks;

SelectorCaps caps8() { return SelectorCaps{8, true, 8 * kMiB, kMaxBlocks}; }

Choice auto_choice(std::int64_t bytes, const SelectorCaps& caps, const TuneTable* table = nullptr) {
  return select_all_reduce(bytes, DType::kBF16, ReduceOp::kSum, caps, Pinned{}, table);
}

TuneTable table_for(int world, std::vector<TuneEntry> entries) {
  return TuneTable(TuneKey{"NVIDIA H200", world, "nvlink-full", 12040, 22703, "0.1.0"},
                   std::move(entries));
}

TEST(Algo, NamesRoundTrip) {
  for (Algo a :
       {Algo::kNone, Algo::kOneShot, Algo::kTwoShot, Algo::kLamport, Algo::kLamportTwoShot})
    EXPECT_EQ(parse_algo(to_string(a)), a);
  EXPECT_EQ(to_string(Algo::kLamport), "lamport");
  EXPECT_EQ(to_string(Algo::kLamportTwoShot), "lamport_two_shot");
  EXPECT_TRUE(kernels::pushes(info(Algo::kLamport).kernel));
  EXPECT_TRUE(kernels::pushes(info(Algo::kLamportTwoShot).kernel));
  EXPECT_FALSE(kernels::pushes(info(Algo::kOneShot).kernel));
  EXPECT_EQ(to_string(Algo::kOneShot), "one_shot");
  EXPECT_EQ(to_string(Algo::kTwoShot), "two_shot");
  EXPECT_EQ(to_string(Algo::kNone), "none");
  EXPECT_FALSE(parse_algo("oneshot").has_value());
  EXPECT_FALSE(parse_algo("").has_value());
  EXPECT_EQ(to_string(Choice{Algo::kTwoShot, 8, 512}), "two_shot 8x512");
  EXPECT_EQ(to_string(Choice{}), "none");
  EXPECT_EQ((Choice{Algo::kOneShot, 1, 512}), (Choice{Algo::kOneShot, 1, 512}));
  EXPECT_NE((Choice{Algo::kOneShot, 1, 512}), (Choice{Algo::kOneShot, 2, 512}));
  EXPECT_NE((Choice{Algo::kOneShot, 1, 512}), (Choice{Algo::kTwoShot, 1, 512}));
  EXPECT_TRUE(is_valid(Choice{}));
  EXPECT_FALSE(is_valid(Choice{Algo::kNone, 1, 0}));
  EXPECT_TRUE(is_valid(Choice{Algo::kOneShot, kMaxBlocks, 1024}));
  EXPECT_FALSE(is_valid(Choice{Algo::kOneShot, kMaxBlocks + 1, 1024}));
  EXPECT_FALSE(is_valid(Choice{Algo::kOneShot, 1, 32}));
}

// ---------------------------------------------------------------------------------------------
// Built-in defaults

TEST(DefaultChoice, SwitchPointsFollowVllmAndSglang) {
  // Two ranks: one-shot at every size.
  for (std::int64_t b : {std::int64_t{16}, 512 * kKiB, 8 * kMiB, 1024 * kMiB})
    EXPECT_EQ(default_choice(b, 2, 36).algo, Algo::kOneShot) << b;
  // Three and four ranks: one-shot below 512 KiB.
  for (int w : {3, 4}) {
    EXPECT_EQ(default_choice(512 * kKiB - 16, w, 36).algo, Algo::kOneShot) << w;
    EXPECT_EQ(default_choice(512 * kKiB, w, 36).algo, Algo::kTwoShot) << w;
  }
  // Five to eight ranks: one-shot below 256 KiB.
  for (int w : {5, 6, 7, 8}) {
    EXPECT_EQ(default_choice(256 * kKiB - 16, w, 36).algo, Algo::kOneShot) << w;
    EXPECT_EQ(default_choice(256 * kKiB, w, 36).algo, Algo::kTwoShot) << w;
    EXPECT_EQ(default_choice(300 * kKiB, w, 36).algo, Algo::kTwoShot) << w;
  }
  EXPECT_EQ(default_choice(300 * kKiB, 4, 36).algo, Algo::kOneShot);
}

TEST(DefaultChoice, BlocksPerSixteenByteVectorsOfWork) {
  // One-shot: bytes / 16 vectors, 512 threads per block.
  EXPECT_EQ(default_launch(Algo::kOneShot, 16, 8, 128), (Choice{Algo::kOneShot, 1, 512}));
  EXPECT_EQ(default_launch(Algo::kOneShot, 1, 8, 128), (Choice{Algo::kOneShot, 1, 512}));
  EXPECT_EQ(default_launch(Algo::kOneShot, 512 * 16, 8, 128).blocks, 1);
  EXPECT_EQ(default_launch(Algo::kOneShot, 512 * 16 + 16, 8, 128).blocks, 2);
  EXPECT_EQ(default_launch(Algo::kOneShot, 512 * 16 + 1, 8, 128).blocks, 2);
  EXPECT_EQ(default_launch(Algo::kOneShot, 10 * 512 * 16, 8, 128).blocks, 10);
  EXPECT_EQ(default_launch(Algo::kOneShot, 36 * 512 * 16, 8, 128).blocks, 36);
  EXPECT_EQ(default_launch(Algo::kOneShot, 37 * 512 * 16, 8, 128).blocks, 36);  // at most 36
  // Two-shot: one rank's work is a 1/world slice.
  EXPECT_EQ(default_launch(Algo::kTwoShot, 1 * kMiB, 8, 128), (Choice{Algo::kTwoShot, 16, 512}));
  EXPECT_EQ(default_launch(Algo::kTwoShot, 1 * kMiB, 4, 128).blocks, 32);
  EXPECT_EQ(default_launch(Algo::kTwoShot, 1 * kMiB, 2, 128).blocks, 36);
  EXPECT_EQ(default_launch(Algo::kTwoShot, 8 * kMiB, 8, 128).blocks, 36);
  EXPECT_EQ(default_launch(Algo::kTwoShot, 16, 8, 128).blocks, 1);
  EXPECT_EQ(default_launch(Algo::kTwoShot, 3 * 512 * 16 * 8 + 16, 8, 128).blocks, 4);
  // max_blocks caps the count; below 1 it counts as 1.
  EXPECT_EQ(default_launch(Algo::kOneShot, 8 * kMiB, 8, 8).blocks, 8);
  EXPECT_EQ(default_launch(Algo::kOneShot, 8 * kMiB, 8, 0).blocks, 1);
  EXPECT_EQ(default_launch(Algo::kOneShot, 8 * kMiB, 8, -3).blocks, 1);
  EXPECT_EQ(default_launch(Algo::kNone, 8 * kMiB, 8, 36), Choice{});
  // Lamport (NOTE [lamport launch]): a vector a thread in blocks of 128 up to 8 blocks, then 16
  // blocks of up to 512 threads (a multiple of 32), then 512-thread blocks as above.
  EXPECT_EQ(default_launch(Algo::kLamport, 16, 8, 128), (Choice{Algo::kLamport, 1, 128}));
  EXPECT_EQ(default_launch(Algo::kLamport, 1 * kKiB, 2, 128), (Choice{Algo::kLamport, 1, 128}));
  EXPECT_EQ(default_launch(Algo::kLamport, 4 * kKiB, 8, 128), (Choice{Algo::kLamport, 2, 128}));
  EXPECT_EQ(default_launch(Algo::kLamport, 16 * kKiB, 8, 128), (Choice{Algo::kLamport, 8, 128}));
  EXPECT_EQ(default_launch(Algo::kLamport, 16 * kKiB + 16, 8, 128),
            (Choice{Algo::kLamport, 16, 128}));
  EXPECT_EQ(default_launch(Algo::kLamport, 40 * kKiB, 8, 128), (Choice{Algo::kLamport, 16, 160}));
  EXPECT_EQ(default_launch(Algo::kLamport, 64 * kKiB, 4, 128), (Choice{Algo::kLamport, 16, 256}));
  EXPECT_EQ(default_launch(Algo::kLamport, 128 * kKiB, 4, 128), (Choice{Algo::kLamport, 16, 512}));
  EXPECT_EQ(default_launch(Algo::kLamport, 256 * kKiB, 2, 128), (Choice{Algo::kLamport, 32, 512}));
  EXPECT_EQ(default_launch(Algo::kLamport, 1 * kMiB, 2, 128), (Choice{Algo::kLamport, 36, 512}));
  // ... within max_blocks: fewer, wider blocks.
  EXPECT_EQ(default_launch(Algo::kLamport, 16 * kKiB, 8, 4), (Choice{Algo::kLamport, 4, 256}));
  EXPECT_EQ(default_launch(Algo::kLamport, 64 * kKiB, 8, 4), (Choice{Algo::kLamport, 4, 512}));
  EXPECT_EQ(default_launch(Algo::kLamport, 1 * kKiB, 8, 0), (Choice{Algo::kLamport, 1, 128}));
  // The Lamport two-shot kernel keeps the shape of the others (a slice a rank).
  EXPECT_EQ(default_launch(Algo::kLamportTwoShot, 1 * kMiB, 8, 128),
            (Choice{Algo::kLamportTwoShot, 16, 512}));
  // default_choice uses the same shape.
  EXPECT_EQ(default_choice(1 * kMiB, 8, 128), default_launch(Algo::kTwoShot, 1 * kMiB, 8, 128));
  EXPECT_EQ(default_choice(64 * kKiB, 8, 128), (Choice{Algo::kOneShot, 8, 512}));
}

// ---------------------------------------------------------------------------------------------
// Hard requirements

TEST(SelectAllReduce, EachHardRequirementFallsBackToNccl) {
  const SelectorCaps caps = caps8();
  ASSERT_NE(auto_choice(64 * kKiB, caps).algo, Algo::kNone);
  auto none = [](std::int64_t bytes, DType dtype, ReduceOp op, const SelectorCaps& c) {
    return select_all_reduce(bytes, dtype, op, c, Pinned{}, nullptr) == Choice{};
  };
  const std::int64_t b = 64 * kKiB;
  SelectorCaps c = caps;
  c.custom_available = false;
  EXPECT_TRUE(none(b, DType::kBF16, ReduceOp::kSum, c));
  for (int w : {-1, 0, 1, 9, 16}) {
    c = caps;
    c.world_size = w;
    EXPECT_TRUE(none(b, DType::kBF16, ReduceOp::kSum, c)) << w;
  }
  for (int w : {2, 3, 4, 5, 6, 7, 8}) {
    c = caps;
    c.world_size = w;
    EXPECT_FALSE(none(b, DType::kBF16, ReduceOp::kSum, c)) << w;
  }
  c = caps;
  c.max_blocks = 0;
  EXPECT_TRUE(none(b, DType::kBF16, ReduceOp::kSum, c));
  for (DType t : {DType::kF64, DType::kI8, DType::kU8, DType::kI32, DType::kU32, DType::kI64,
                  DType::kU64, DType::kF8E4M3, DType::kF8E5M2})
    EXPECT_TRUE(none(b, t, ReduceOp::kSum, caps)) << to_string(t);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    EXPECT_FALSE(none(b, t, ReduceOp::kSum, caps)) << to_string(t);
  for (ReduceOp op : {ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg})
    EXPECT_TRUE(none(b, DType::kBF16, op, caps)) << to_string(op);
  EXPECT_TRUE(none(0, DType::kBF16, ReduceOp::kSum, caps));
  EXPECT_TRUE(none(-2, DType::kBF16, ReduceOp::kSum, caps));
  EXPECT_TRUE(none(8 * kMiB + 2, DType::kBF16, ReduceOp::kSum, caps));
  EXPECT_FALSE(none(8 * kMiB, DType::kBF16, ReduceOp::kSum, caps));
  EXPECT_FALSE(none(2, DType::kBF16, ReduceOp::kSum, caps));
  // A partial element is not a tensor.
  EXPECT_TRUE(none(3, DType::kBF16, ReduceOp::kSum, caps));
  EXPECT_TRUE(none(6, DType::kF32, ReduceOp::kSum, caps));
  // Hard requirements win over a forced algorithm and over the table.
  c = caps;
  c.custom_available = false;
  EXPECT_EQ(select_all_reduce(b, DType::kBF16, ReduceOp::kSum, c, Pinned{Algo::kOneShot}, nullptr),
            Choice{});
  TuneTable t = table_for(8, {{16 * kMiB, Choice{Algo::kOneShot, 4, 256}, 1}});
  EXPECT_EQ(auto_choice(9 * kMiB, caps, &t), Choice{});
}

// ---------------------------------------------------------------------------------------------
// Forced algorithms, the table, clamping

TEST(SelectAllReduce, ForcedAlgorithms) {
  const SelectorCaps caps = caps8();
  auto forced = [&](std::int64_t bytes, Pinned f, const TuneTable* table = nullptr) {
    return select_all_reduce(bytes, DType::kF16, ReduceOp::kSum, caps, f, table);
  };
  EXPECT_EQ(forced(64 * kKiB, Pinned{Algo::kNone}), Choice{});
  EXPECT_EQ(forced(4 * kMiB, Pinned{Algo::kOneShot}),
            default_launch(Algo::kOneShot, 4 * kMiB, 8, 128));
  EXPECT_EQ(forced(4 * kMiB, Pinned{Algo::kOneShot}).algo, Algo::kOneShot);
  EXPECT_EQ(forced(1 * kKiB, Pinned{Algo::kTwoShot}), (Choice{Algo::kTwoShot, 1, 512}));
  // A forced algorithm ignores the table.
  TuneTable t = table_for(8, {{8 * kMiB, Choice{Algo::kOneShot, 7, 128}, 1}});
  EXPECT_EQ(forced(1 * kKiB, Pinned{Algo::kTwoShot}, &t), (Choice{Algo::kTwoShot, 1, 512}));
  EXPECT_EQ(forced(1 * kKiB, Pinned{Algo::kNone}, &t), Choice{});
  EXPECT_EQ(forced(1 * kKiB, Pinned{}, &t), (Choice{Algo::kOneShot, 7, 128}));
}

// Lamport serves f16/bf16 up to the group's Lamport size: by default for small messages, when
// forced or tuned; anywhere else the same request gets the built-in one-/two-shot choice.
TEST(SelectAllReduce, LamportOnlyWhereItCanServe) {
  SelectorCaps caps = caps8();
  caps.lamport_max_bytes = 512 * kKiB;
  auto pick = [&](std::int64_t bytes, DType t, Pinned f, const SelectorCaps& c,
                  const TuneTable* table = nullptr) {
    return select_all_reduce(bytes, t, ReduceOp::kSum, c, f, table);
  };
  // Defaults: up to 64 KiB for 5-8 ranks, up to 256 KiB for 2-4 ranks.
  EXPECT_EQ(pick(1 * kKiB, DType::kBF16, Pinned{}, caps), (Choice{Algo::kLamport, 1, 128}));
  EXPECT_EQ(pick(kLamportMaxBytes, DType::kF16, Pinned{}, caps).algo, Algo::kLamport);
  EXPECT_EQ(pick(kLamportMaxBytes + 2, DType::kBF16, Pinned{}, caps),
            default_choice(kLamportMaxBytes + 2, 8, 128));
  SelectorCaps caps4 = caps;
  caps4.world_size = 4;
  EXPECT_EQ(pick(kLamportMaxBytesUpTo4Ranks, DType::kBF16, Pinned{}, caps4).algo, Algo::kLamport);
  EXPECT_EQ(pick(kLamportMaxBytesUpTo4Ranks + 2, DType::kBF16, Pinned{}, caps4).algo,
            Algo::kOneShot);
  // Never for f32, never past the group's Lamport buffers, never without them.
  EXPECT_EQ(pick(1 * kKiB, DType::kF32, Pinned{}, caps), default_choice(1 * kKiB, 8, 128));
  EXPECT_EQ(pick(1 * kKiB, DType::kF32, Pinned{Algo::kLamport}, caps),
            default_choice(1 * kKiB, 8, 128));
  SelectorCaps small = caps;
  small.lamport_max_bytes = 4 * kKiB;
  EXPECT_EQ(pick(4 * kKiB, DType::kBF16, Pinned{}, small).algo, Algo::kLamport);
  EXPECT_EQ(pick(4 * kKiB + 2, DType::kBF16, Pinned{}, small).algo, Algo::kOneShot);
  EXPECT_EQ(pick(1 * kKiB, DType::kBF16, Pinned{}, caps8()).algo, Algo::kOneShot);
  EXPECT_EQ(pick(1 * kKiB, DType::kBF16, Pinned{Algo::kLamport}, caps8()).algo, Algo::kOneShot);
  // Forced: wherever it can serve, with the default launch shape.
  EXPECT_EQ(pick(512 * kKiB, DType::kBF16, Pinned{Algo::kLamport}, caps),
            default_launch(Algo::kLamport, 512 * kKiB, 8, 128));
  EXPECT_EQ(pick(512 * kKiB + 2, DType::kBF16, Pinned{Algo::kLamport}, caps),
            default_choice(512 * kKiB + 2, 8, 128));
  // Tuned: the table's Lamport where it can serve, the defaults where it cannot.
  TuneTable t = table_for(8, {{1 * kMiB, Choice{Algo::kLamport, 3, 256}, 1}});
  EXPECT_EQ(pick(256 * kKiB, DType::kBF16, Pinned{}, caps, &t), (Choice{Algo::kLamport, 3, 256}));
  EXPECT_EQ(pick(1 * kMiB, DType::kBF16, Pinned{}, caps, &t), default_choice(1 * kMiB, 8, 128));
  EXPECT_EQ(pick(4 * kKiB, DType::kF32, Pinned{}, caps, &t), default_choice(4 * kKiB, 8, 128));
  // A table that prefers one-shot keeps it, even where Lamport could serve.
  TuneTable one = table_for(8, {{1 * kMiB, Choice{Algo::kOneShot, 2, 256}, 1}});
  EXPECT_EQ(pick(1 * kKiB, DType::kBF16, Pinned{}, caps, &one), (Choice{Algo::kOneShot, 2, 256}));
  // Clamped like the others.
  caps.max_blocks = 2;
  EXPECT_EQ(pick(256 * kKiB, DType::kBF16, Pinned{}, caps, &t), (Choice{Algo::kLamport, 2, 256}));
}

// The Lamport two-shot needs room for one slice in and one slice of sums per slot: messages up
// to world_size / 2 slots. Never a built-in choice; forced or tuned where it fits.
TEST(SelectAllReduce, LamportTwoShotWhereItsSlicesFit) {
  SelectorCaps caps = caps8();
  caps.lamport_max_bytes = 512 * kKiB;
  auto pick = [&](std::int64_t bytes, DType t, Pinned f, const TuneTable* table = nullptr) {
    return select_all_reduce(bytes, t, ReduceOp::kSum, caps, f, table);
  };
  EXPECT_EQ(lamport_two_shot_slot_bytes(2 * kMiB, 8), 512 * kKiB);
  EXPECT_EQ(pick(2 * kMiB, DType::kBF16, Pinned{Algo::kLamportTwoShot}),
            default_launch(Algo::kLamportTwoShot, 2 * kMiB, 8, 128));
  // Sliced like two-shot: one block per 512 vectors of one rank's slice.
  EXPECT_EQ(default_launch(Algo::kLamportTwoShot, 2 * kMiB, 8, 128),
            (Choice{Algo::kLamportTwoShot, 32, 512}));
  EXPECT_EQ(pick(2 * kMiB + 256, DType::kBF16, Pinned{Algo::kLamportTwoShot}),
            default_choice(2 * kMiB + 256, 8, 128));
  EXPECT_EQ(pick(64 * kKiB, DType::kF32, Pinned{Algo::kLamportTwoShot}),
            default_choice(64 * kKiB, 8, 128));
  // Not a built-in choice.
  for (std::int64_t b : {1 * kKiB, 256 * kKiB, 1 * kMiB})
    EXPECT_NE(pick(b, DType::kBF16, Pinned{}).algo, Algo::kLamportTwoShot) << b;
  TuneTable t = table_for(8, {{8 * kMiB, Choice{Algo::kLamportTwoShot, 16, 512}, 1}});
  EXPECT_EQ(pick(1 * kMiB, DType::kBF16, Pinned{}, &t), (Choice{Algo::kLamportTwoShot, 16, 512}));
  EXPECT_EQ(pick(4 * kMiB, DType::kBF16, Pinned{}, &t), default_choice(4 * kMiB, 8, 128));
  EXPECT_EQ(pick(1 * kMiB, DType::kF16, Pinned{}, &t), (Choice{Algo::kLamportTwoShot, 16, 512}));
  EXPECT_EQ(pick(1 * kMiB, DType::kF32, Pinned{}, &t), default_choice(1 * kMiB, 8, 128));
}

TEST(SelectAllReduce, TableWhereItCoversTheSizeDefaultsElsewhere) {
  const SelectorCaps caps = caps8();
  TuneTable t = table_for(8, {{512, Choice{Algo::kTwoShot, 2, 128}, 1},
                              {4 * kKiB, Choice{Algo::kTwoShot, 3, 256}, 2},
                              {64 * kKiB, Choice{}, 3},  // NCCL won this bucket
                              {1 * kMiB, Choice{Algo::kOneShot, 24, 1024}, 4}});
  EXPECT_EQ(auto_choice(2, caps, &t), (Choice{Algo::kTwoShot, 2, 128}));
  EXPECT_EQ(auto_choice(512, caps, &t), (Choice{Algo::kTwoShot, 2, 128}));
  EXPECT_EQ(auto_choice(514, caps, &t), (Choice{Algo::kTwoShot, 3, 256}));
  EXPECT_EQ(auto_choice(8 * kKiB, caps, &t), Choice{});
  EXPECT_EQ(auto_choice(1 * kMiB, caps, &t), (Choice{Algo::kOneShot, 24, 1024}));
  // Beyond the table: the defaults.
  EXPECT_EQ(auto_choice(1 * kMiB + 2, caps, &t), default_choice(1 * kMiB + 2, 8, 128));
  EXPECT_EQ(auto_choice(1 * kMiB + 2, caps, &t).algo, Algo::kTwoShot);
  // No table, an empty table, or one tuned for another group size: the defaults.
  EXPECT_EQ(auto_choice(512, caps, nullptr), default_choice(512, 8, 128));
  TuneTable empty;
  EXPECT_EQ(auto_choice(512, caps, &empty), default_choice(512, 8, 128));
  TuneTable four = table_for(4, {{8 * kMiB, Choice{Algo::kTwoShot, 2, 128}, 1}});
  EXPECT_EQ(auto_choice(512, caps, &four), default_choice(512, 8, 128));
  SelectorCaps caps4 = caps;
  caps4.world_size = 4;
  EXPECT_EQ(auto_choice(512, caps4, &four), (Choice{Algo::kTwoShot, 2, 128}));
}

TEST(SelectAllReduce, BlocksAreClampedToTheCapsInEveryCase) {
  SelectorCaps caps = caps8();
  caps.max_blocks = 4;
  TuneTable t = table_for(8, {{1 * kMiB, Choice{Algo::kTwoShot, 64, 256}, 1},
                              {2 * kMiB, Choice{Algo::kOneShot, 3, 256}, 1}});
  EXPECT_EQ(auto_choice(1 * kMiB, caps, &t), (Choice{Algo::kTwoShot, 4, 256}));
  EXPECT_EQ(auto_choice(2 * kMiB, caps, &t), (Choice{Algo::kOneShot, 3, 256}));
  EXPECT_EQ(auto_choice(4 * kMiB, caps, &t), (Choice{Algo::kTwoShot, 4, 512}));
  EXPECT_EQ(
      select_all_reduce(4 * kMiB, DType::kF32, ReduceOp::kSum, caps, Pinned{Algo::kOneShot}, &t),
      (Choice{Algo::kOneShot, 4, 512}));
  caps.max_blocks = 1;
  EXPECT_EQ(auto_choice(1 * kMiB, caps, &t).blocks, 1);
}

// The selector is a pure function of its inputs: the same inputs give the same output on
// every call and in any order, which is what keeps all ranks on one path.
TEST(SelectAllReduce, IsAPureFunction) {
  TuneTable t = table_for(8, {{4 * kKiB, Choice{Algo::kOneShot, 2, 256}, 1},
                              {256 * kKiB, Choice{Algo::kTwoShot, 9, 512}, 1}});
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = 2; b <= 16 * kMiB; b = b * 3 / 2 + 2) sizes.push_back(b);
  struct Call {
    std::int64_t bytes;
    int world;
    Pinned forced;
    bool with_table;
  };
  std::vector<Call> calls;
  for (std::int64_t b : sizes)
    for (int w : {1, 2, 4, 8, 9})
      for (Pinned f :
           {Pinned{}, Pinned{Algo::kNone}, Pinned{Algo::kOneShot}, Pinned{Algo::kTwoShot}})
        for (bool with_table : {false, true}) calls.push_back({b, w, f, with_table});
  auto run = [&](const Call& c) {
    SelectorCaps caps = caps8();
    caps.world_size = c.world;
    return select_all_reduce(c.bytes, DType::kBF16, ReduceOp::kSum, caps, c.forced,
                             c.with_table ? &t : nullptr);
  };
  std::vector<Choice> first;
  for (const Call& c : calls) first.push_back(run(c));
  for (std::size_t i = calls.size(); i-- > 0;) {
    Choice again = run(calls[i]);
    EXPECT_EQ(again, first[i]) << calls[i].bytes;
    EXPECT_TRUE(is_valid(again)) << again;
  }
}

// ---- the fused all-reduce + residual add + RMSNorm -------------------------------------------

SelectorCaps fused_caps(int world, std::int64_t lamport = 512 * kKiB) {
  return SelectorCaps{world, true, 8 * kMiB, kMaxBlocks, lamport};
}

TEST(SelectAddRmsNorm, EachHardRequirementFallsBack) {
  const SelectorCaps ok = fused_caps(4);
  const char* why = "unset";
  EXPECT_EQ(select_add_rmsnorm(8, 4096, DType::kBF16, ok, {}, nullptr, &why).algo, Algo::kLamport);
  EXPECT_EQ(why, nullptr);
  auto expect_none = [](const SelectorCaps& caps, DType t, std::int64_t rows, std::int64_t hidden,
                        Pinned pinned = {}) {
    const char* why = nullptr;
    EXPECT_EQ(select_add_rmsnorm(rows, hidden, t, caps, pinned, nullptr, &why).algo, Algo::kNone);
    EXPECT_NE(why, nullptr);
  };
  SelectorCaps c = ok;
  c.custom_available = false;
  expect_none(c, DType::kBF16, 8, 4096);
  expect_none(fused_caps(1), DType::kBF16, 8, 4096);
  expect_none(fused_caps(4, 0), DType::kBF16, 8, 4096);  // no fusion workspace
  expect_none(ok, DType::kF32, 8, 4096);
  expect_none(ok, DType::kBF16, 0, 4096);
  expect_none(ok, DType::kBF16, 8, 0);
  expect_none(ok, DType::kBF16, 2048, 16384);  // beyond every slot
  expect_none(ok, DType::kBF16, 8, 4096, Algo::kNone);
  (void)select_add_rmsnorm(2048, 16384, DType::kBF16, ok, {}, nullptr, &why);
  EXPECT_NE(std::string(why).find("TPCOMM_LAMPORT_MAX_BYTES"), std::string::npos);
}

TEST(SelectAddRmsNorm, OneShotForFewTokensTwoShotBeyondThenTheFallback) {
  for (int world : {2, 3, 4, 8}) {
    const SelectorCaps caps = fused_caps(world, 8 * kMiB);
    const std::int64_t one_shot = info(Algo::kLamport).fused.bound(world);
    const std::int64_t two_shot = info(Algo::kLamportTwoShot).fused.bound(world);
    auto at = [&](std::int64_t bytes) {  // rows of 128 elements
      return select_add_rmsnorm(bytes / 256, 128, DType::kBF16, caps, {}, nullptr).algo;
    };
    EXPECT_EQ(at(one_shot), Algo::kLamport) << world;
    EXPECT_EQ(at(one_shot + 256), two_shot > one_shot ? Algo::kLamportTwoShot : Algo::kNone)
        << world;
    EXPECT_EQ(at(std::max(one_shot, two_shot) + 256), Algo::kNone) << world;
    const char* why = nullptr;
    (void)select_add_rmsnorm((std::max(one_shot, two_shot) + 256) / 256, 128, DType::kBF16, caps,
                             {}, nullptr, &why);
    EXPECT_NE(std::string(why).find("built-in bounds"), std::string::npos);
  }
}

TEST(SelectAddRmsNorm, PinnedAndTuned) {
  const SelectorCaps caps = fused_caps(4, 4 * kMiB);
  EXPECT_EQ(select_add_rmsnorm(1, 4096, DType::kF16, caps, Algo::kLamportTwoShot, nullptr).algo,
            Algo::kLamportTwoShot);
  // A pin that cannot fuse is ignored here: the built-in choice.
  EXPECT_EQ(select_add_rmsnorm(1, 4096, DType::kF16, caps, Algo::kOneShot, nullptr).algo,
            Algo::kLamport);
  const TuneTable tuned(
      TuneKey{"NVIDIA H200", 4, "one-gpu", 1, 1, "0.1.0"}, {},
      {{8192, Choice{Algo::kLamportTwoShot, 1, 512}, 3.0}, {16384, Choice{}, 4.0}});
  EXPECT_EQ(select_add_rmsnorm(1, 4096, DType::kBF16, caps, {}, &tuned).algo,
            Algo::kLamportTwoShot);
  EXPECT_EQ(select_add_rmsnorm(2, 4096, DType::kBF16, caps, {}, &tuned).algo, Algo::kNone);
  EXPECT_EQ(select_add_rmsnorm(4, 4096, DType::kBF16, caps, {}, &tuned).algo, Algo::kLamport)
      << "beyond the tuned buckets: the built-in choice";
  // A tuned algorithm wins past the built-in bounds.
  const TuneTable big(TuneKey{"NVIDIA H200", 4, "one-gpu", 1, 1, "0.1.0"}, {},
                      {{4 * kMiB, Choice{Algo::kLamportTwoShot, 1, 512}, 3.0}});
  EXPECT_EQ(select_add_rmsnorm(4 * kMiB / 8192, 4096, DType::kBF16, caps, {}, &big).algo,
            Algo::kLamportTwoShot);
  // A table tuned for another world size is not used.
  EXPECT_EQ(select_add_rmsnorm(2, 4096, DType::kBF16, fused_caps(2, 4 * kMiB), {}, &tuned).algo,
            Algo::kLamport);
}

TEST(SelectAddRmsNorm, LaunchShapeFollowsTheRow) {
  // hidden -> blocks per row, threads: a row wider than one block's threads (by more than an
  // eighth) is shared by a group of blocks while the rows leave blocks to spare, each block
  // holding at most 256 packs of it.
  for (auto [hidden, group, threads] : {std::tuple<std::int64_t, int, int>{1, 1, 64},
                                        {7, 1, 64},
                                        {512, 1, 128},
                                        {2880, 1, 512},
                                        {4096, 1, 512},
                                        {7168, 4, 256},
                                        {8192, 8, 256},
                                        {16384, 8, 512}}) {
    const Choice c = fused_launch(Algo::kLamport, 3, hidden, kMaxBlocks);
    EXPECT_EQ(c.threads, threads) << hidden;
    EXPECT_EQ(c.group, group) << hidden;
    EXPECT_GE(c.blocks, 3 * group) << hidden;
    EXPECT_EQ(c.blocks % group, 0) << hidden;
    EXPECT_TRUE(is_valid(c));
  }
  // No groups once the rows take every block; then blocks take several rows.
  EXPECT_EQ(fused_launch(Algo::kLamport, 16, 7168, kMaxBlocks).blocks, 64);
  EXPECT_EQ(fused_launch(Algo::kLamport, 16, 7168, kMaxBlocks).group, 4);
  EXPECT_EQ(fused_launch(Algo::kLamport, 64, 7168, kMaxBlocks).blocks, 64);
  EXPECT_EQ(fused_launch(Algo::kLamport, 64, 7168, kMaxBlocks).group, 1);
  EXPECT_EQ(fused_launch(Algo::kLamport, 64, 7168, kMaxBlocks).threads, 512);
  EXPECT_EQ(fused_launch(Algo::kLamport, 2048, 4096, 20).blocks, 20);
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 7168, 20).blocks, 8);
  // Groups only as large as the GPU holds clusters of them for every row: 16 rows of 8192 in
  // groups of 4 need 64 blocks in clusters of 4, past a GPU's 60; groups of 2 fit. Without
  // clusters, a block per row.
  EXPECT_EQ(fused_launch(Algo::kLamport, 16, 8192, 66).blocks, 64);
  const Choice pairs = fused_launch(Algo::kLamport, 16, 8192, 66, {66, 60, 56});
  EXPECT_EQ(pairs.blocks, 32);
  EXPECT_EQ(pairs.group, 2);
  const Choice alone = fused_launch(Algo::kLamport, 16, 8192, 66, {0, 0, 0});
  EXPECT_EQ(alone.blocks, 16);
  EXPECT_EQ(alone.group, 1);
  EXPECT_EQ(alone.threads, 512);
}

TEST(SelectAddRmsNorm, RowsOfOneBlockSpreadTheirPushes) {
  // Rows on the Lamport one-shot kernel take as many blocks as its plain all-reduce of the same
  // bytes up to 16, in whole groups (the blocks past the rows only push and refill), never fewer
  // than the rows and never past max_blocks; the two-shot kernel keeps a block per row.
  for (std::int64_t rows : {1, 2, 4, 8, 16, 64}) {
    const Choice c = fused_launch(Algo::kLamport, rows, 4096, kMaxBlocks);
    const Choice plain = default_launch(Algo::kLamport, rows * 4096 * 2, 2, kMaxBlocks);
    EXPECT_EQ(c.blocks, std::max<std::int64_t>(rows, std::min(plain.blocks, 16))) << rows;
    EXPECT_EQ(c.group, 1) << rows;
    EXPECT_EQ(c.threads, 512) << rows;
    EXPECT_TRUE(is_valid(c)) << rows;
  }
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 4096, kMaxBlocks).blocks, 4);
  EXPECT_EQ(fused_launch(Algo::kLamport, 2, 4096, kMaxBlocks).blocks, 8);
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 4096, 3).blocks, 3);
  EXPECT_EQ(fused_launch(Algo::kLamportTwoShot, 1, 4096, kMaxBlocks).blocks, 1);
  // Hidden 7168 in groups of 4: 14 KiB a row, 7 blocks for the plain all-reduce of one row, 16
  // of two or more; never past what the clusters of 4 hold.
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 7168, kMaxBlocks).blocks, 8);
  EXPECT_EQ(fused_launch(Algo::kLamport, 2, 7168, kMaxBlocks).blocks, 16);
  EXPECT_EQ(fused_launch(Algo::kLamport, 4, 7168, kMaxBlocks).blocks, 16);
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 7168, kMaxBlocks, {kMaxBlocks, 4, kMaxBlocks}).blocks,
            4);
  EXPECT_EQ(fused_launch(Algo::kLamport, 1, 7168, kMaxBlocks).group, 4);
}

// ---- the reduce-scatter form (reduce_scatter_add_rmsnorm) -------------------------------------

TEST(SelectReduceScatterAddRmsNorm, TheTwoShotFinishesEachRanksRows) {
  for (int world : {2, 4, 8}) {
    const SelectorCaps caps = fused_caps(world, 8 * kMiB);
    const char* why = "unset";
    // One row a rank: the Lamport two-shot, shaped for that one row.
    const Choice one = select_reduce_scatter_add_rmsnorm(world, 4096, DType::kBF16, caps, {}, &why);
    EXPECT_EQ(one.algo, Algo::kLamportTwoShot) << world;
    EXPECT_EQ(why, nullptr);
    EXPECT_EQ(one, fused_launch(Algo::kLamportTwoShot, 1, 4096, kMaxBlocks)) << world;
    // Past the all-reduce form's bound: the fallback.
    const std::int64_t bound = info(Algo::kLamportTwoShot).fused.bound(world);
    const std::int64_t rows = (bound / (4096 * 2) / world + 1) * world;
    EXPECT_EQ(select_reduce_scatter_add_rmsnorm(rows, 4096, DType::kBF16, caps, {}).algo,
              Algo::kNone)
        << world;
    // A deterministic group takes it wherever it fits (NOTE [batch invariance]).
    SelectorCaps det = caps;
    det.deterministic = true;
    EXPECT_EQ(select_reduce_scatter_add_rmsnorm(rows, 4096, DType::kBF16, det, {}).algo,
              Algo::kLamportTwoShot)
        << world;
  }
}

TEST(SelectReduceScatterAddRmsNorm, WhatItDeclines) {
  const SelectorCaps caps = fused_caps(4, 8 * kMiB);
  auto why_none = [&](std::int64_t rows, std::int64_t hidden, DType t, Pinned pinned = {}) {
    const char* why = nullptr;
    EXPECT_EQ(select_reduce_scatter_add_rmsnorm(rows, hidden, t, caps, pinned, &why).algo,
              Algo::kNone)
        << rows << " x " << hidden;
    return std::string(why != nullptr ? why : "");
  };
  // Rows that do not split evenly, or slices that do not start on a pack.
  EXPECT_NE(why_none(6, 4096, DType::kBF16).find("16-byte"), std::string::npos);
  EXPECT_NE(why_none(4, 2884, DType::kBF16).find("16-byte"), std::string::npos);
  // ... but rows off packs are fine where the slices are on them (8 rows of 2884).
  EXPECT_EQ(select_reduce_scatter_add_rmsnorm(32, 2884, DType::kBF16, caps, {}).algo,
            Algo::kLamportTwoShot);
  EXPECT_FALSE(why_none(4, 4096, DType::kF32).empty());
  EXPECT_NE(why_none(4, 4096, DType::kBF16, Algo::kNone).find("nccl"), std::string::npos);
  // A pin that fuses but keeps every rank's sum declines; one that cannot fuse is ignored.
  EXPECT_NE(why_none(4, 4096, DType::kBF16, Algo::kLamport).find("every rank's sum"),
            std::string::npos);
  EXPECT_EQ(select_reduce_scatter_add_rmsnorm(4, 4096, DType::kBF16, caps, Algo::kOneShot).algo,
            Algo::kLamportTwoShot);
  EXPECT_EQ(
      select_reduce_scatter_add_rmsnorm(4, 4096, DType::kBF16, caps, Algo::kLamportTwoShot).algo,
      Algo::kLamportTwoShot);
}

}  // namespace
}  // namespace tpcomm
