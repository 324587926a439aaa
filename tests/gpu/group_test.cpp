// SPDX-License-Identifier: Apache-2.0
// Group's own behaviour on virtual ranks: argument checks, backend choice, world size one,
// calls from several streams.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::options_for;
using testing::run_case;
using testing::run_ranks;
using testing::StreamHolder;
using testing::wrong_elements;

TEST(Group, InvalidArgumentsLeaveTheGroupUsable) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, options_for("auto"));
    StreamHolder stream;
    DeviceBuffer a(4096), b(4096);
    auto bf = TensorView::flat(a.get(), DType::kBF16, 1024, 0);
    EXPECT_EQ(g.all_reduce(bf, TensorView::flat(b.get(), DType::kF16, 1024, 0), stream.stream()),
              Status::kInvalidArgument);
    EXPECT_NE(g.last_error().find("bfloat16"), std::string::npos);
    EXPECT_EQ(g.all_reduce(bf, TensorView::flat(b.get(), DType::kBF16, 1000, 0), stream.stream()),
              Status::kInvalidArgument);
    EXPECT_EQ(g.all_reduce(TensorView::flat(nullptr, DType::kBF16, 8, 0), bf, stream.stream()),
              Status::kInvalidArgument);
    auto strided = TensorView::contiguous(a.get(), DType::kBF16, {32, 32}, 0);
    std::swap(strided.strides[0], strided.strides[1]);
    EXPECT_EQ(g.all_reduce(strided, strided, stream.stream()), Status::kInvalidArgument);
    EXPECT_EQ(g.all_reduce(bf, TensorView::flat(b.get(), DType::kBF16, 1024, 1), stream.stream()),
              Status::kInvalidArgument);
    EXPECT_EQ(g.health(), Status::kOk);
    std::vector<std::vector<unsigned char>> outputs(2);
    std::mutex m;
    run_case(g, rank, {1024, DType::kBF16}, 7, stream.stream(), outputs, m);
  });
}

TEST(Group, NoBackendForOversizedMessageWithoutNccl) {
  // Virtual ranks share one GPU, so NCCL is left out; above the custom limit nothing serves.
  run_ranks(2, [&](int, Bootstrap& boot) {
    Group g(boot, 0, options_for("auto", 64 << 10));
    StreamHolder stream;
    DeviceBuffer a(1 << 20);
    auto big = TensorView::flat(a.get(), DType::kBF16, 1 << 19, 0);
    EXPECT_EQ(g.backend_for_all_reduce(big, big), "none");
    EXPECT_EQ(g.all_reduce(big, big, stream.stream()), Status::kUnsupported);
    EXPECT_EQ(g.health(), Status::kOk);
    auto small = TensorView::flat(a.get(), DType::kBF16, 1024, 0);
    EXPECT_EQ(g.backend_for_all_reduce(small, small), "custom_ar:lamport");
    auto small_f32 = TensorView::flat(a.get(), DType::kF32, 1024, 0);
    EXPECT_EQ(g.backend_for_all_reduce(small_f32, small_f32), "custom_ar:one_shot");
  });
}

// TPCOMM_LAMPORT_MAX_BYTES=0: no Lamport buffers, and the sizes Lamport would serve go to
// one-shot, forced or not.
TEST(Group, LamportCanBeTurnedOff) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    for (const char* algo : {"auto", "lamport"}) {
      Options o = options_for(algo);
      o.lamport_max_bytes = 0;
      Group g(boot, 0, o);
      DeviceBuffer a(4096);
      auto v = TensorView::flat(a.get(), DType::kBF16, 1024, 0);
      EXPECT_EQ(g.backend_for_all_reduce(v, v), "custom_ar:one_shot");
      StreamHolder stream;
      std::vector<std::vector<unsigned char>> outputs(2);
      std::mutex m;
      run_case(g, rank, {1024, DType::kBF16}, 99, stream.stream(), outputs, m);
    }
  });
}

// Ranks whose settings differ where they must match fail at once, all of them, naming the
// setting and the ranks with each value, instead of waiting for each other at their first call.
TEST(Group, RanksWithDifferentSettingsFailAtOnceNamingThem) {
  struct Case {
    const char* name;
    void (*apply)(Options&, GroupConfig&);
    const char* says;
  };
  const Case cases[] = {
      {"algo", [](Options& o, GroupConfig&) { o.algo = "one_shot"; },
       "TPCOMM_ALGO: lamport on rank 0; one_shot on rank 1"},
      {"lamport bytes", [](Options& o, GroupConfig&) { o.lamport_max_bytes = 1 << 20; },
       "TPCOMM_LAMPORT_MAX_BYTES: 524288 on rank 0; 1048576 on rank 1"},
      {"fusion tokens", [](Options&, GroupConfig& c) { c.fusion_max_tokens = 64; },
       "TPCOMM_FUSION_MAX_TOKENS (or GroupConfig::fusion_max_tokens): 128 on rank 0; 64 on rank 1"},
      {"custom off", [](Options& o, GroupConfig&) { o.disable_custom_ar = true; },
       "TPCOMM_DISABLE_CUSTOM_AR: 0 on rank 0; 1 on rank 1"},
      {"no fusion", [](Options&, GroupConfig& c) { c.fusion = false; },
       "GroupConfig::fusion: 1 on rank 0; 0 on rank 1"},
      {"deterministic", [](Options&, GroupConfig& c) { c.deterministic = Determinism::kStrict; },
       "TPCOMM_DETERMINISTIC (or GroupConfig::deterministic): 0 on rank 0; strict on rank 1"},
  };
  for (const Case& c : cases) {
    run_ranks(2, [&](int rank, Bootstrap& boot) {
      Options o = options_for("lamport");
      GroupConfig config;
      if (rank == 1) c.apply(o, config);
      const auto start = std::chrono::steady_clock::now();
      try {
        Group g(boot, 0, o, config);
        ADD_FAILURE() << c.name << ": rank " << rank << " built the group";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::kInvalidArgument) << c.name;
        EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos)
            << c.name << ": " << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << c.name;
    });
  }
}

// A rank that never starts using a new stream: the others' first call there fails at the group's
// deadline (1 s here), not the bootstrap's (20 s).
TEST(Group, ANewStreamsWarmUpWaitsTheGroupsDeadlineOnly) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    Options o = options_for("one_shot");
    o.timeout_ms = 1000;
    Group g(boot, 0, o);
    if (rank == 0) {
      StreamHolder stream;
      DeviceBuffer a(4096);
      auto v = TensorView::flat(a.get(), DType::kF32, 1024, 0);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(g.all_reduce(v, v, stream.stream()), Status::kTimeout);
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
      EXPECT_NE(g.last_error().find("warming up a new stream"), std::string::npos)
          << g.last_error();
    } else {
      // Late, after rank 0 gave up; then this rank's own kernel waits for rank 0 in vain (the
      // deadline again), and both groups' teardowns meet.
      std::this_thread::sleep_for(std::chrono::seconds(3));
      StreamHolder stream;
      DeviceBuffer a(4096);
      auto v = TensorView::flat(a.get(), DType::kF32, 1024, 0);
      (void)g.all_reduce(v, v, stream.stream());
      EXPECT_EQ(cudaStreamSynchronize(stream.stream()), cudaSuccess);
    }
  });
}

TEST(Group, WorldSizeOneCopies) {
  run_ranks(1, [&](int, Bootstrap& boot) {
    Group g(boot, 0, Options{});
    StreamHolder stream;
    DeviceBuffer a(4096), b(4096), wrong(8);
    auto in = TensorView::flat(a.get(), DType::kF32, 1000, 0);
    auto out = TensorView::flat(b.get(), DType::kF32, 1000, 0);
    EXPECT_EQ(g.backend_for_all_reduce(in, out), "local");
    ASSERT_EQ(
        kernels::fill_data(a.get(), DType::kF32, 1000, 5, 0, ReduceOp::kSum, 0, stream.stream()),
        Status::kOk);
    ASSERT_EQ(kernels::poison(b.get(), 4096, stream.stream()), Status::kOk);
    ASSERT_EQ(g.all_reduce(in, out, stream.stream()), Status::kOk);
    ASSERT_EQ(g.all_gather(in, out, stream.stream()), Status::kOk);
    EXPECT_EQ(wrong_elements(wrong, b.get(), DType::kF32, 1000, 5, 0, 1, stream.stream()), 0u);
  });
}

// Without NCCL (virtual ranks share a GPU), the reduce-scatter is the all-reduce of the whole
// input into a temporary and a copy of this rank's slice: exact at 2, 3 and 4 ranks, f32 and
// bf16, eager and replayed from a graph (which captures the temporary's allocation).
TEST(Group, ReduceScatterWithoutNcclIsTheAllReduceAndASlice) {
  const std::int64_t most = 4099;
  for (int world : {2, 3, 4}) {
    std::vector<std::uint64_t> seeds;  // the same on every rank
    for (int i = 0; i < 8; ++i) seeds.push_back(testing::fresh_seed());
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      Group g(boot, 0, options_for("auto"));
      StreamHolder stream;
      const cudaStream_t cs = stream.get();
      const Stream s = stream.stream();
      DeviceBuffer in(most * world * 4), out(most * 4), wrong(8);
      auto* bad = static_cast<unsigned long long*>(wrong.get());
      std::size_t next = 0;
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        for (std::int64_t per : {std::int64_t{1}, most}) {
          for (bool captured : {false, true}) {
            const std::uint64_t seed = seeds[next++];
            const auto iv = TensorView::flat(in.get(), dtype, per * world, 0);
            const auto ov = TensorView::flat(out.get(), dtype, per, 0);
            const std::string what = detail::concat(to_string(dtype), " x", per, " world ", world,
                                                    captured ? " captured" : " eager");
            const std::string path = g.backend_for_reduce_scatter(iv, ov);
            EXPECT_TRUE(path.starts_with("custom_ar:") && path.ends_with("+slice"))
                << what << ": " << path;
            ASSERT_EQ(
                kernels::fill_data(in.get(), dtype, per * world, seed, rank, ReduceOp::kSum, 0, s),
                Status::kOk);
            ASSERT_EQ(kernels::poison(out.get(), most * 4, s), Status::kOk);
            if (captured) {
              const testing::CapturedGraph graph(g, s, [&] {
                EXPECT_EQ(g.reduce_scatter(iv, ov, s), Status::kOk) << what << g.last_error();
              });
              ASSERT_TRUE(graph.ok());
              ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
              boot.barrier();  // NOTE [graphs of virtual ranks]
              ASSERT_EQ(graph.launch(), cudaSuccess);
              ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
            } else {
              ASSERT_EQ(g.reduce_scatter(iv, ov, s), Status::kOk) << what << g.last_error();
            }
            ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
            unsigned long long got = 0;
            ASSERT_EQ(cudaMemsetAsync(bad, 0, sizeof(got), cs), cudaSuccess);
            ASSERT_EQ(kernels::check_data(out.get(), dtype, per, seed, rank, world, ReduceOp::kSum,
                                          kernels::Collective::kReduceScatter, 0, bad, s),
                      Status::kOk);
            ASSERT_EQ(cudaMemcpyAsync(&got, bad, sizeof(got), cudaMemcpyDeviceToHost, cs),
                      cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
            EXPECT_EQ(got, 0u) << what << " rank " << rank;
            boot.barrier();  // every rank has read its output before the next case
          }
        }
      }
    });
  }
}

// Calls issued back to back from two streams, without synchronising in between, are ordered one
// after the other by the group (otherwise two kernels of one group would race on its workspace).
TEST(Group, CallsFromSeveralStreamsAreOrdered) {
  const int world = 2;
  const int calls = 16;
  const std::int64_t count = 100000;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, options_for("two_shot"));
    StreamHolder s1, s2;
    std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
    for (int i = 0; i < calls; ++i) {
      ins.push_back(std::make_unique<DeviceBuffer>(count * 2));
      outs.push_back(std::make_unique<DeviceBuffer>(count * 2));
      ASSERT_EQ(kernels::fill_data(ins.back()->get(), DType::kBF16, count, 500 + i, rank,
                                   ReduceOp::kSum, 0, s1.stream()),
                Status::kOk);
    }
    ASSERT_EQ(cudaStreamSynchronize(s1.get()), cudaSuccess);
    boot.barrier();
    for (int i = 0; i < calls; ++i) {
      Stream s = (i % 2 == 0 ? s1 : s2).stream();
      ASSERT_EQ(g.all_reduce(TensorView::flat(ins[i]->get(), DType::kBF16, count, 0),
                             TensorView::flat(outs[i]->get(), DType::kBF16, count, 0), s),
                Status::kOk);
    }
    ASSERT_EQ(cudaStreamSynchronize(s1.get()), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s2.get()), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    DeviceBuffer wrong(8);
    unsigned long long bad = 0;
    for (int i = 0; i < calls; ++i)
      bad += wrong_elements(wrong, outs[i]->get(), DType::kBF16, count, 500 + i, rank, world,
                            s1.stream());
    EXPECT_EQ(bad, 0u);
  });
}

}  // namespace
}  // namespace tpcomm
