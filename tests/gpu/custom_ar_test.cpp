// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce through Group, with virtual ranks on one GPU: exact results, bitwise
// equality across ranks, tails, misalignment, in place, graphs, timeouts and abort.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {
namespace {

using testing::Case;
using testing::DeviceBuffer;
using testing::expect_identical;
using testing::fresh_seed;
using testing::options_for;
using testing::run_case;
using testing::run_ranks;
using testing::StreamHolder;

/// Every algorithm of the registry, by name: a new row is swept without a change here.
std::vector<std::string> registry_names() {
  std::vector<std::string> out;
  for (const AlgoInfo& a : kAlgorithms) out.emplace_back(a.name);
  return out;
}
using testing::wrong_elements;

class CustomAllReduceSweep : public ::testing::TestWithParam<std::tuple<int, std::string, bool>> {};

TEST_P(CustomAllReduceSweep, ExactAndBitwiseIdentical) {
  const auto [world, algo, programmatic] = GetParam();
  const std::int64_t max_bytes = 1 << 20;
  std::vector<Case> cases;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    const std::int64_t max_count = max_bytes / static_cast<std::int64_t>(dtype_size(t));
    for (std::int64_t n :
         {std::int64_t{1}, std::int64_t{3}, std::int64_t{8}, std::int64_t{9}, std::int64_t{63},
          std::int64_t{1000}, std::int64_t{4097}, std::int64_t{65536 + 5}, max_count})
      cases.push_back({n, t});
    cases.push_back({12345, t, 1, 0});        // misaligned input
    cases.push_back({12345, t, 0, 3});        // misaligned output
    cases.push_back({12345, t, 0, 0, true});  // in place
    cases.push_back({7, t, 1, 1, true});      // in place, misaligned, tail only
  }
  std::vector<std::vector<unsigned char>> outputs(static_cast<std::size_t>(world));
  std::mutex m;
  std::vector<std::uint64_t> seeds;
  for (std::size_t i = 0; i < cases.size(); ++i) seeds.push_back(fresh_seed());
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o = options_for(algo, max_bytes);
    o.programmatic_launch = programmatic;
    o.lamport_max_bytes = max_bytes;
    Group g(boot, 0, o);
    StreamHolder stream;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      auto v = TensorView::flat(reinterpret_cast<void*>(256), c.dtype, c.count, 0);
      // Lamport serves 16-bit types; f32 gets the built-in choice.
      const bool lamport = algo == "lamport" || algo == "lamport_two_shot";
      if (!lamport || c.dtype != DType::kF32) {
        EXPECT_EQ(g.backend_for_all_reduce(v, v), "custom_ar:" + std::string(algo));
      }
      run_case(g, rank, c, seeds[i], stream.stream(), outputs, m);
      boot.barrier();
      if (rank == 0) expect_identical(outputs, "case");
      boot.barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, CustomAllReduceSweep,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::ValuesIn(registry_names()),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param) +
                                  (std::get<2>(info.param) ? "_pdl" : "_plain_launch");
                         });

// One-shot and two-shot visit ranks in the same order: their results are bitwise equal.
TEST(CustomAllReduce, OneShotAndTwoShotAgreeBitwise) {
  const int world = 4;
  const std::int64_t count = 300001;
  const std::uint64_t seed = fresh_seed();
  std::vector<std::vector<unsigned char>> one(world), two(world);
  std::mutex m;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    StreamHolder stream;
    {
      Group g(boot, 0, options_for("one_shot"));
      run_case(g, rank, {count, DType::kBF16}, seed, stream.stream(), one, m);
    }
    {
      Group g(boot, 0, options_for("two_shot"));
      run_case(g, rank, {count, DType::kBF16}, seed, stream.stream(), two, m);
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_TRUE(one[r] == two[r]) << "rank " << r;
}

// Capture K all-reduces into one graph per rank (registered and staged sizes, in place and
// out of place), then replay with fresh inputs each time.
TEST(CustomAllReduce, GraphCaptureAndReplayWithChangingInputs) {
  for (std::int64_t register_min : {std::int64_t{0}, std::int64_t{2} << 20}) {
    const int world = 4;
    const std::vector<Case> cases = {{1000, DType::kBF16},
                                     {262144 + 3, DType::kBF16},
                                     {4096, DType::kF32, 0, 0, true},
                                     {77777, DType::kF16, 1, 2},
                                     {1 << 20, DType::kBF16, 0, 0, true}};
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      Options o = options_for("auto", 4 << 20);
      o.custom_ar_register_min_bytes = register_min;
      Group g(boot, 0, o);
      StreamHolder stream;
      std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
      std::vector<void*> in_ptr, out_ptr;
      for (const Case& c : cases) {
        const std::size_t es = dtype_size(c.dtype);
        ins.push_back(std::make_unique<DeviceBuffer>((c.count + 8) * es));
        outs.push_back(std::make_unique<DeviceBuffer>((c.count + 8) * es));
        in_ptr.push_back(ins.back()->bytes_ptr() + c.in_offset * es);
        out_ptr.push_back(c.in_place ? in_ptr.back()
                                     : outs.back()->bytes_ptr() + c.out_offset * es);
      }
      const testing::CapturedGraph graph(g, stream.stream(), [&] {
        for (std::size_t i = 0; i < cases.size(); ++i) {
          const Case& c = cases[i];
          EXPECT_EQ(
              g.all_reduce(TensorView::flat(in_ptr[i], c.dtype, c.count, 0),
                           TensorView::flat(out_ptr[i], c.dtype, c.count, 0), stream.stream()),
              Status::kOk)
              << g.last_error();
        }
      });
      ASSERT_TRUE(graph.ok());
      DeviceBuffer wrong(sizeof(unsigned long long));
      for (int replay = 0; replay < 3; ++replay) {
        const std::uint64_t seed =
            1000 + static_cast<std::uint64_t>(replay) * 7919;  // same on all ranks
        for (std::size_t i = 0; i < cases.size(); ++i) {
          ASSERT_EQ(kernels::poison(outs[i]->get(), static_cast<std::int64_t>(outs[i]->size()),
                                    stream.stream()),
                    Status::kOk);
          ASSERT_EQ(kernels::fill_data(in_ptr[i], cases[i].dtype, cases[i].count, seed + i, rank,
                                       ReduceOp::kSum, 0, stream.stream()),
                    Status::kOk);
        }
        ASSERT_EQ(graph.launch(), cudaSuccess);
        unsigned long long bad = 0;
        for (std::size_t i = 0; i < cases.size(); ++i)
          bad += wrong_elements(wrong, out_ptr[i], cases[i].dtype, cases[i].count, seed + i, rank,
                                world, stream.stream());
        ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
        EXPECT_EQ(bad, 0u) << "rank " << rank << " replay " << replay << " register_min "
                           << register_min;
      }
    });
  }
}

// What a benchmark or a decode loop does: eager calls, then a graph of many calls replayed back
// to back, with or without an event recorded inside the graph, and timing events between the
// replays. Every replay must finish (nothing waits out a deadline) with exact results.
class GraphReplays : public ::testing::TestWithParam<std::tuple<int, bool, bool, std::string>> {};

TEST_P(GraphReplays, BackToBackAfterEagerCalls) {
  const auto [world, eager_first, event_in_graph, algo] = GetParam();
  const std::int64_t count = 512;
  const int ops = 50, replays = 20;
  const std::uint64_t seed = fresh_seed();
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o = options_for(algo);
    o.timeout_ms = 3000;
    Group g(boot, 0, o);
    StreamHolder stream;
    cudaStream_t s = stream.get();
    DeviceBuffer in(count * 2), out(count * 2), wrong(sizeof(unsigned long long));
    const auto iv = TensorView::flat(in.get(), DType::kBF16, count, 0);
    const auto ov = TensorView::flat(out.get(), DType::kBF16, count, 0);
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, count, seed, rank, ReduceOp::kSum, 0,
                                 stream.stream()),
              Status::kOk);
    if (eager_first) {
      for (int i = 0; i < 6; ++i) ASSERT_EQ(g.all_reduce(iv, ov, stream.stream()), Status::kOk);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    boot.barrier();
    cudaEvent_t marker = nullptr;
    ASSERT_EQ(cudaEventCreate(&marker), cudaSuccess);
    const testing::CapturedGraph graph(g, stream.stream(), [&] {
      for (int i = 0; i < ops; ++i) ASSERT_EQ(g.all_reduce(iv, ov, stream.stream()), Status::kOk);
      if (event_in_graph) {
        ASSERT_EQ(cudaEventRecord(marker, s), cudaSuccess);
      }
    });
    ASSERT_TRUE(graph.ok());
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    boot.barrier();
    ASSERT_EQ(graph.launch(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    boot.barrier();
    std::vector<cudaEvent_t> events(replays + 1);
    for (auto& e : events) ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(events[0], s), cudaSuccess);
    for (int r = 0; r < replays; ++r) {
      ASSERT_EQ(graph.launch(), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(events[static_cast<std::size_t>(r) + 1], s), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
    // The last replay's output is exact.
    EXPECT_EQ(
        wrong_elements(wrong, out.get(), DType::kBF16, count, seed, rank, world, stream.stream()),
        0u)
        << "rank " << rank;
    for (auto& e : events) cudaEventDestroy(e);
    cudaEventDestroy(marker);
    boot.barrier();  // no rank destroys its graph while a peer's replay may still need it
  });
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GraphReplays,
    ::testing::Combine(::testing::Values(2, 4, 8), ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values("one_shot", "lamport", "lamport_two_shot")),
    [](const auto& info) {
      return "world" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_eager_first" : "") +
             (std::get<2>(info.param) ? "_event_in_graph" : "") + "_" + std::get<3>(info.param);
    });

// The Lamport buffers rotate and are refilled with the empty mark behind each operation: a
// long run of back-to-back operations whose sizes grow and shrink, each with fresh inputs, in
// place or not, aligned or not, must be exact every time (data left behind by an earlier
// operation would be taken for a peer's input).
class LamportReuse : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(LamportReuse, BuffersAreReusedCleanlyAcrossSizes) {
  const auto [world, algo] = GetParam();
  const std::int64_t sizes[] = {65536, 8, 4097, 1000, 65536, 1, 33000, 63, 2048, 65535};
  const int ops = 40;
  std::vector<std::uint64_t> seeds;
  for (int i = 0; i < ops; ++i) seeds.push_back(fresh_seed());
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, options_for(algo, 1 << 20));
    StreamHolder stream;
    struct Op {
      std::int64_t n;
      DType t;
      std::unique_ptr<DeviceBuffer> in, out;
      void* ip;
      void* op;
    };
    std::vector<Op> all;
    for (int i = 0; i < ops; ++i) {
      Op o{sizes[i % std::size(sizes)],
           i % 3 == 0 ? DType::kF16 : DType::kBF16,
           std::make_unique<DeviceBuffer>(65536 * 2 + 64),
           std::make_unique<DeviceBuffer>(65536 * 2 + 64),
           nullptr,
           nullptr};
      // Every fifth operation in place, every seventh with misaligned buffers.
      o.ip = o.in->bytes_ptr() + (i % 7 == 6 ? 2 : 0);
      o.op = i % 5 == 4 ? o.ip : o.out->bytes_ptr() + (i % 7 == 6 ? 6 : 0);
      ASSERT_EQ(
          kernels::poison(o.out->get(), static_cast<std::int64_t>(o.out->size()), stream.stream()),
          Status::kOk);
      ASSERT_EQ(
          kernels::fill_data(o.ip, o.t, o.n, seeds[i], rank, ReduceOp::kSum, 0, stream.stream()),
          Status::kOk);
      all.push_back(std::move(o));
    }
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    boot.barrier();
    for (const Op& o : all)
      ASSERT_EQ(g.all_reduce(TensorView::flat(o.ip, o.t, o.n, 0),
                             TensorView::flat(o.op, o.t, o.n, 0), stream.stream()),
                Status::kOk)
          << g.last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    DeviceBuffer wrong(sizeof(unsigned long long));
    for (int i = 0; i < ops; ++i)
      EXPECT_EQ(wrong_elements(wrong, all[i].op, all[i].t, all[i].n, seeds[i], rank, world,
                               stream.stream()),
                0u)
          << "rank " << rank << " operation " << i << " count " << all[i].n;
    boot.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Lamport, LamportReuse,
                         ::testing::Combine(::testing::Values(3, 4, 8),
                                            ::testing::Values("lamport", "lamport_two_shot")),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// The library's own kernels alone, first launched on the stream in the middle of a sequence:
// bf16, then f16, then f32 all-reduces of growing and shrinking sizes, back to back with no host
// synchronisation, so each dtype's kernels start while peers may already wait (NOTE [first
// launch] in backends/custom_ar.cpp). Every operation exact.
class LibraryKernels : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(LibraryKernels, Bf16ThenF16ThenF32WithoutWaiting) {
  const auto [world, algo] = GetParam();
  const std::int64_t bytes[] = {2048, 65536, 512, 1 << 20, 24576, 4 << 20, 8192};
  struct Op {
    DType t;
    std::int64_t n;
    std::uint64_t seed;
  };
  std::vector<Op> ops;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32})
    for (std::int64_t b : bytes)
      ops.push_back({t, b / static_cast<std::int64_t>(dtype_size(t)), fresh_seed()});
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o = options_for(algo);
    o.timeout_ms = 5000;
    Group g(boot, 0, o);
    StreamHolder stream;
    std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
    for (const Op& op : ops) {
      ins.push_back(std::make_unique<DeviceBuffer>(op.n * dtype_size(op.t)));
      outs.push_back(std::make_unique<DeviceBuffer>(op.n * dtype_size(op.t)));
      ASSERT_EQ(kernels::fill_data(ins.back()->get(), op.t, op.n, op.seed, rank, ReduceOp::kSum, 0,
                                   stream.stream()),
                Status::kOk);
    }
    DeviceBuffer wrong(sizeof(unsigned long long));
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    boot.barrier();
    for (std::size_t i = 0; i < ops.size(); ++i)
      ASSERT_EQ(
          g.all_reduce(TensorView::flat(ins[i]->get(), ops[i].t, ops[i].n, 0),
                       TensorView::flat(outs[i]->get(), ops[i].t, ops[i].n, 0), stream.stream()),
          Status::kOk)
          << g.last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    for (std::size_t i = 0; i < ops.size(); ++i)
      EXPECT_EQ(wrong_elements(wrong, outs[i]->get(), ops[i].t, ops[i].n, ops[i].seed, rank, world,
                               stream.stream()),
                0u)
          << "rank " << rank << " operation " << i << " " << to_string(ops[i].t);
    boot.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Sequence, LibraryKernels,
                         ::testing::Combine(::testing::Values(4, 8),
                                            ::testing::Values("auto", "lamport")),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// -0.0 is the empty mark of the Lamport buffers: inputs holding it are sent as +0.0, so the
// operation still completes (instead of waiting for data that looks unwritten) with the right
// sums, and every rank's output is bitwise the same.
class LamportNegativeZero : public ::testing::TestWithParam<std::string> {};

TEST_P(LamportNegativeZero, InputsDoNotStall) {
  const int world = 4;
  const std::int64_t count = 4099;
  std::vector<std::vector<std::uint16_t>> outputs(world);
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o = options_for(GetParam());
    o.timeout_ms = 3000;
    Group g(boot, 0, o);
    StreamHolder stream;
    // Even elements are -0.0 on every rank; odd ones small integers (exact in bf16).
    std::vector<std::uint16_t> host(count);
    for (std::int64_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(rank + i % 7);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &v, 4);
      host[static_cast<std::size_t>(i)] =
          i % 2 == 0 ? std::uint16_t{0x8000} : static_cast<std::uint16_t>(bits >> 16);
    }
    DeviceBuffer in(count * 2), out(count * 2);
    ASSERT_EQ(
        cudaMemcpyAsync(in.get(), host.data(), count * 2, cudaMemcpyHostToDevice, stream.get()),
        cudaSuccess);
    ASSERT_EQ(g.all_reduce(TensorView::flat(in.get(), DType::kBF16, count, 0),
                           TensorView::flat(out.get(), DType::kBF16, count, 0), stream.stream()),
              Status::kOk);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    std::vector<std::uint16_t> got(count);
    ASSERT_EQ(cudaMemcpy(got.data(), out.get(), count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int bad = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r) expected += i % 2 == 0 ? 0.0f : static_cast<float>(r + i % 7);
      const std::uint32_t bits = static_cast<std::uint32_t>(got[static_cast<std::size_t>(i)]) << 16;
      float value = 0;
      std::memcpy(&value, &bits, 4);
      if (value != expected) ++bad;
    }
    EXPECT_EQ(bad, 0) << "rank " << rank;
    outputs[static_cast<std::size_t>(rank)] = std::move(got);
  });
  for (int r = 1; r < world; ++r) EXPECT_TRUE(outputs[r] == outputs[0]) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Lamport, LamportNegativeZero,
                         ::testing::Values("lamport", "lamport_two_shot"),
                         [](const auto& info) { return info.param; });

// Closing a capture scope is collective: a rank that captured a different number of calls fails
// every rank with kMismatch naming the first call that differs, before any registration.
TEST(CustomAllReduce, CaptureCountMismatchFailsEveryRank) {
  const int world = 2;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o = options_for("one_shot");
    o.custom_ar_register_min_bytes = 0;
    Group g(boot, 0, o);
    StreamHolder stream;
    DeviceBuffer buf(4096), out(4096);
    cudaGraph_t graph = nullptr;
    auto scope = g.capture(stream.stream());
    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const int calls = rank == 0 ? 2 : 1;
    for (int i = 0; i < calls; ++i)
      EXPECT_EQ(g.all_reduce(TensorView::flat(buf.get(), DType::kBF16, 1024, 0),
                             TensorView::flat(out.get(), DType::kBF16, 1024, 0), stream.stream()),
                Status::kOk);
    ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
    EXPECT_EQ(scope.close(), Status::kMismatch);
    EXPECT_NE(g.last_error().find("ranks captured different collectives (captured call 2"),
              std::string::npos)
        << g.last_error();
    EXPECT_NE(g.last_error().find("rank 1 no call"), std::string::npos) << g.last_error();
    cudaGraphDestroy(graph);
  });
}

// A rank that never launches: every other rank's kernel gives up within the deadline, the
// group reports kTimeout naming the missing rank, and a new group works afterwards.
TEST(CustomAllReduce, MissingRankTimesOutAndGroupCanBeRebuilt) {
  const int world = 4;
  for (const char* algo : {"one_shot", "lamport", "lamport_two_shot"})
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      SCOPED_TRACE(std::string(algo));
      StreamHolder stream;
      DeviceBuffer in(1 << 16), out(1 << 16);
      auto iv = TensorView::flat(in.get(), DType::kBF16, 1 << 15, 0);
      auto ov = TensorView::flat(out.get(), DType::kBF16, 1 << 15, 0);
      {
        Options o = options_for(algo);
        o.timeout_ms = 500;
        Group g(boot, 0, o);
        // Every rank warms the stream up (a barrier); then rank 0 stays away.
        ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
        const auto start = std::chrono::steady_clock::now();
        if (rank != 0) {
          // Operations queued behind the one that times out give up with it, instead of each
          // waiting out the deadline (20 x 0.5 s).
          ASSERT_EQ(g.all_reduce(iv, ov, stream.stream()), Status::kOk);
          for (int i = 0; i < 19; ++i) {
            const Status s = g.all_reduce(iv, ov, stream.stream());
            ASSERT_TRUE(s == Status::kOk || s == Status::kTimeout) << to_string(s);
          }
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          const double waited =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          EXPECT_LT(waited, 5.0);
          EXPECT_EQ(g.health(), Status::kTimeout);
          EXPECT_NE(g.last_error().find("waiting for rank 0"), std::string::npos) << g.last_error();
          // Sticky: every later call answers the same.
          EXPECT_EQ(g.all_reduce(iv, ov, stream.stream()), Status::kTimeout);
        }
        boot.barrier();
      }
      Group fresh(boot, 0, options_for("two_shot"));
      std::vector<std::vector<unsigned char>> outputs(world);
      std::mutex m;
      run_case(fresh, rank, {5000, DType::kBF16}, 42, stream.stream(), outputs, m);
    });
}

// abort() makes a waiting kernel give up long before the deadline.
TEST(CustomAllReduce, AbortReleasesWaitingKernels) {
  const int world = 2;
  for (const char* algo : {"one_shot", "lamport"}) {
    SCOPED_TRACE(std::string(algo));
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      DeviceBuffer in(4096), out(4096);
      Options o = options_for(algo);
      o.timeout_ms = 60000;
      Group g(boot, 0, o);
      ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
      if (rank == 1) {
        const auto start = std::chrono::steady_clock::now();
        ASSERT_EQ(g.all_reduce(TensorView::flat(in.get(), DType::kBF16, 2048, 0),
                               TensorView::flat(out.get(), DType::kBF16, 2048, 0), stream.stream()),
                  Status::kOk);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        g.abort();
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  10.0);
        EXPECT_EQ(g.health(), Status::kAborted);
      }
      boot.barrier();
    });
  }
}

// abort() from another thread, while the owning thread waits on its stream for a kernel that
// waits for a rank that never comes: the kernel gives up, the owner's next call says why.
TEST(CustomAllReduce, AbortFromAnotherThreadReleasesTheOwner) {
  const int world = 2;
  for (const char* algo : {"one_shot", "lamport", "two_shot"}) {
    SCOPED_TRACE(std::string(algo));
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      DeviceBuffer in(4096), out(4096);
      Options o = options_for(algo);
      o.timeout_ms = 60000;
      Group g(boot, 0, o);
      ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
      if (rank == 1) {
        const auto start = std::chrono::steady_clock::now();
        ASSERT_EQ(g.all_reduce(TensorView::flat(in.get(), DType::kBF16, 2048, 0),
                               TensorView::flat(out.get(), DType::kBF16, 2048, 0), stream.stream()),
                  Status::kOk);
        std::thread aborter([&g] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          g.abort();
        });
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        aborter.join();
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  10.0);
        EXPECT_EQ(g.all_reduce(TensorView::flat(in.get(), DType::kBF16, 2048, 0),
                               TensorView::flat(out.get(), DType::kBF16, 2048, 0), stream.stream()),
                  Status::kAborted);
        EXPECT_NE(g.last_error().find("aborted"), std::string::npos) << g.last_error();
        EXPECT_EQ(g.health(), Status::kAborted);
      }
      boot.barrier();
    });
  }
}

}  // namespace
}  // namespace tpcomm
