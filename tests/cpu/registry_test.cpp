// SPDX-License-Identifier: Apache-2.0
// The registry of algorithms, walked row by row: every name parses back to itself, every row has
// a kernel for every dtype and world size it claims, every kernel of the library is a row's, and
// every launch shape is within limits.
// Links the library (for the kernel table) but makes no CUDA call: runs without a GPU.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kernels/kernels.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/tuner.hpp"

namespace tpcomm {
namespace {

TEST(Registry, EveryNameParsesBackToItsRow) {
  std::set<std::string_view> seen{"auto", "nccl", "none"};
  for (const AlgoInfo& a : kAlgorithms) {
    EXPECT_TRUE(seen.insert(a.name).second) << a.name << " is not unique";
    EXPECT_EQ(parse_algo(a.name), a.algo);
    EXPECT_EQ(to_string(a.algo), a.name);
    EXPECT_FALSE(a.summary.empty()) << a.name;
    Pinned pinned;
    ASSERT_TRUE(parse_pinned(a.name, &pinned)) << a.name;
    EXPECT_EQ(pinned, a.algo);
    EXPECT_EQ(to_string(pinned), a.name);
    for (std::string_view alias : a.aliases) {
      if (alias.empty()) continue;
      EXPECT_TRUE(seen.insert(alias).second) << alias << " is not unique";
      ASSERT_TRUE(parse_pinned(alias, &pinned)) << alias;
      EXPECT_EQ(pinned, a.algo) << alias;
    }
  }
  Pinned pinned;
  EXPECT_TRUE(parse_pinned("auto", &pinned));
  EXPECT_FALSE(pinned.has_value());
  EXPECT_TRUE(parse_pinned("NCCL", &pinned));
  EXPECT_EQ(pinned, Algo::kNone);
  EXPECT_FALSE(parse_pinned("three_shot", &pinned));
  EXPECT_FALSE(parse_pinned("", &pinned));
}

TEST(Registry, EveryRowHasAKernelForWhatItServes) {
  for (const AlgoInfo& a : kAlgorithms) {
    ASSERT_NE(a.kernel.instance, nullptr) << a.name << ": its kernel file is not in libtpcomm";
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      const bool served = !kernels::pushes(a.kernel) || dtype_size(t) == 2;
      for (int world = 2; world <= kMaxRanks; ++world)
        EXPECT_EQ(kernels::kernel_function(a.kernel, t, world) != nullptr, served)
            << a.name << " " << to_string(t) << " world " << world;
      EXPECT_EQ(fits(a.algo, 1024, t, 8, 1 << 20), served) << a.name;
    }
    EXPECT_EQ(kernels::kernel_function(a.kernel, DType::kBF16, 1), nullptr);
    EXPECT_EQ(kernels::kernel_function(a.kernel, DType::kBF16, kMaxRanks + 1), nullptr);
  }
}

// The other direction: every kernel of the library (TPCOMM_ALL_REDUCE_KERNELS, the weak
// declarations) is in libtpcomm and is the kernel of exactly one row, so the selector, the tuner
// and the warm-up (`launch_every_kernel`, which walks the rows) all find it.
TEST(Registry, EveryKernelIsServedByARow) {
  for (std::size_t i = 0; i < kAllReduceInstances.size(); ++i) {
    const auto instance = kAllReduceInstances[i];
    ASSERT_NE(instance, nullptr) << "kernel " << i << ": its kernel file is not in libtpcomm";
    int rows = 0;
    for (const AlgoInfo& a : kAlgorithms) rows += a.kernel.instance == instance ? 1 : 0;
    EXPECT_EQ(rows, 1) << "kernel " << i << " of TPCOMM_ALL_REDUCE_KERNELS";
  }
  for (const AlgoInfo& a : kAlgorithms) {
    int listed = 0;
    for (const auto instance : kAllReduceInstances) listed += a.kernel.instance == instance ? 1 : 0;
    EXPECT_EQ(listed, 1) << a.name << ": its kernel is not in TPCOMM_ALL_REDUCE_KERNELS";
  }
}

// The algorithms that fuse carry every fused epilogue for the dtypes they serve; the others none;
// only they have a built-in place for the fused operation.
TEST(Registry, EveryFusedEpilogueIsInstantiatedWhereItIsServed) {
  for (const AlgoInfo& a : kAlgorithms) {
    EXPECT_EQ(a.fused.order != 0, kernels::fuses(a.kernel)) << a.name;
    for (int f = 1; f < kernels::kFusionCount; ++f) {
      const auto fusion = static_cast<kernels::Fusion>(f);
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
        const bool served =
            kernels::fuses(a.kernel) && kernels::on_lamport(fusion) && dtype_size(t) == 2;
        for (int world = 2; world <= kMaxRanks; ++world)
          EXPECT_EQ(kernels::kernel_function(a.kernel, t, world, fusion) != nullptr, served)
              << a.name << " fusion " << f << " " << to_string(t) << " world " << world;
      }
    }
  }
}

TEST(Registry, LaunchShapesAreWithinLimits) {
  for (const AlgoInfo& a : kAlgorithms) {
    EXPECT_GE(a.max_blocks, 1) << a.name;
    EXPECT_LE(a.max_blocks, kMaxBlocks) << a.name << ": the signal pads hold kMaxBlocks blocks";
  }
  for (int threads : kTunerThreads) EXPECT_TRUE(is_valid_threads(threads)) << threads;
  // The Lamport kernels are built for at most kLamportMaxThreads threads (their registers).
  EXPECT_FALSE(is_valid(Choice{Algo::kLamport, 1, 1024}));
  EXPECT_TRUE(is_valid(Choice{Algo::kLamport, 1, kernels::kLamportMaxThreads}));
  EXPECT_TRUE(is_valid(Choice{Algo::kOneShot, 1, 1024}));
  for (int blocks : kTunerBlocks) EXPECT_TRUE(blocks >= 1 && blocks <= kMaxBlocks) << blocks;
  for (int world : {2, 3, 4, 8}) {
    SelectorCaps caps{world, true, 8 << 20, kMaxBlocks, 512 << 10};
    for (std::int64_t bytes = 16; bytes <= caps.max_bytes; bytes *= 4) {
      const auto candidates = tune_candidates(bytes, caps);
      EXPECT_FALSE(candidates.empty()) << bytes;
      for (const Choice& c : candidates) EXPECT_TRUE(is_valid(c)) << c;
      const Choice built_in = built_in_choice(bytes, DType::kBF16, caps, true);
      EXPECT_TRUE(is_valid(built_in) && built_in.algo != Algo::kNone) << bytes;
    }
  }
}

// Some algorithm that reads peers' inputs takes every size by default, so the built-in choice
// always has an answer.
TEST(Registry, TheBuiltInChoiceCoversEverySize) {
  for (int world = 2; world <= kMaxRanks; ++world) {
    bool covered = false;
    for (const AlgoInfo& a : kAlgorithms)
      covered = covered || (!kernels::pushes(a.kernel) && a.built_in.order != 0 &&
                            a.built_in.bound(world) == kUnbounded);
    EXPECT_TRUE(covered) << "world " << world;
  }
}

}  // namespace
}  // namespace tpcomm
