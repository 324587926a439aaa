// SPDX-License-Identifier: Apache-2.0
// No result silently wrong, on virtual ranks: ranks that call different collectives fail with
// kMismatch naming both calls, eager and captured; a kernel that cannot complete poisons its
// outputs, and every graph replay after it does too; the watchdog reports a failure without the
// caller asking (callback) or takes the process down (teardown).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/custom_ar.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::options_for;
using testing::run_ranks;
using testing::StreamHolder;
using testing::to_host;
using Clock = std::chrono::steady_clock;

/// One rank's side of a call: which collective, its dtype and element count, and the hidden
/// size of a fused call.
struct Call {
  /// kLmHead: `count` shard logits of `hidden` columns (vocabulary / world size), two ranks'
  /// rows each.
  /// kMoe: the MoE finalize of `count` / `hidden` tokens, two experts each.
  enum Kind { kAllReduce, kAllGather, kFused, kAllToAll, kLmHead, kMoe } kind = kAllReduce;
  DType dtype = DType::kBF16;
  std::int64_t count = 0;
  std::int64_t hidden = 0;

  /// How the library names it in a message.
  [[nodiscard]] std::string describe() const {
    static constexpr const char* kNames[] = {
        "all_reduce", "all_gather",       "all_reduce_add_rmsnorm",
        "all_to_all", "lm_head_exchange", "moe_finalize_all_reduce_add_rmsnorm"};
    std::string text = std::string(kNames[kind]) + " " + std::to_string(count) + " " +
                       std::string(to_string(dtype));
    if (kind == kFused || kind == kMoe) text += " (hidden " + std::to_string(hidden) + ")";
    return text;
  }
};

/// Device buffers for any call of up to 4 MiB per rank.
struct Buffers {
  static constexpr std::size_t kBytes = std::size_t{4} << 20;
  DeviceBuffer in{kBytes}, out{2 * kBytes}, residual{kBytes}, gamma{kBytes};
  DeviceBuffer counter{sizeof(unsigned long long)};
  DeviceBuffer moe_map{64 << 10}, moe_weights{64 << 10};  // int32 and f32 [tokens, 2], zero

  /// Inputs of small integers; outputs zero, so that poisoning shows.
  void reset(Stream s, int rank) {
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, kBytes / 2, 7, rank, ReduceOp::kSum, 0, s),
              Status::kOk);
    ASSERT_EQ(cudaMemsetAsync(out.get(), 0, out.size(), reinterpret_cast<cudaStream_t>(s)),
              cudaSuccess);
    ASSERT_EQ(
        cudaMemsetAsync(residual.get(), 0, residual.size(), reinterpret_cast<cudaStream_t>(s)),
        cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(gamma.get(), 0, gamma.size(), reinterpret_cast<cudaStream_t>(s)),
              cudaSuccess);
    for (DeviceBuffer* b : {&moe_map, &moe_weights})
      ASSERT_EQ(cudaMemsetAsync(b->get(), 0, b->size(), reinterpret_cast<cudaStream_t>(s)),
                cudaSuccess);
  }
};

Status issue(Group& g, const Call& c, Buffers& b, Stream s) {
  const int dev = 0;
  switch (c.kind) {
    case Call::kAllReduce:
      return g.all_reduce(TensorView::flat(b.in.get(), c.dtype, c.count, dev),
                          TensorView::flat(b.out.get(), c.dtype, c.count, dev), s);
    case Call::kAllGather:
      return g.all_gather(TensorView::flat(b.in.get(), c.dtype, c.count, dev),
                          TensorView::flat(b.out.get(), c.dtype, c.count * g.world_size(), dev), s);
    case Call::kAllToAll:
      return g.all_to_all(TensorView::flat(b.in.get(), c.dtype, c.count, dev),
                          TensorView::flat(b.out.get(), c.dtype, c.count, dev), s);
    case Call::kMoe: {
      // Every token's two experts are row 0 of `in` (the map is zero), weighted by zero.
      const std::int64_t tokens = c.count / c.hidden;
      const MoeCombine moe{
          TensorView::contiguous(b.in.get(), c.dtype, {2 * tokens, c.hidden}, dev),
          TensorView::contiguous(b.moe_map.get(), DType::kI32, {tokens, 2}, dev),
          TensorView::contiguous(b.moe_weights.get(), DType::kF32, {tokens, 2}, dev),
          {}};
      const auto x = TensorView::contiguous(b.out.get(), c.dtype, {tokens, c.hidden}, dev);
      const auto res = TensorView::contiguous(b.residual.get(), c.dtype, {tokens, c.hidden}, dev);
      return g.moe_finalize_all_reduce_add_rmsnorm(
          moe, res, TensorView::flat(b.gamma.get(), c.dtype, c.hidden, dev), 1e-6f, x, res, s);
    }
    case Call::kLmHead: {
      // Every rank computed [world x rows, vocab / world] logits; it gets [rows, vocab] back.
      const std::int64_t rows = c.count / c.hidden / g.world_size();
      return g.lm_head_exchange(
          TensorView::contiguous(b.in.get(), c.dtype, {g.world_size() * rows, c.hidden}, dev),
          TensorView::contiguous(b.out.get(), c.dtype, {rows, c.hidden * g.world_size()}, dev),
          LmHeadLayout::equal(rows), s);
    }
    case Call::kFused: {
      // In place as engines call it: norm_out is x (here `out`, holding x), residual_out the
      // residual.
      const std::int64_t rows = c.count / c.hidden;
      const auto x = TensorView::contiguous(b.out.get(), c.dtype, {rows, c.hidden}, dev);
      const auto res = TensorView::contiguous(b.residual.get(), c.dtype, {rows, c.hidden}, dev);
      return g.all_reduce_add_rmsnorm(
          x, res, TensorView::flat(b.gamma.get(), c.dtype, c.hidden, dev), 1e-6f, x, res, s);
    }
  }
  return Status::kInternal;
}

/// A path a call can take: the algorithm pinned (TPCOMM_ALGO) and the call.
struct Path {
  const char* algo;
  Call call;
};

/// Every custom all-reduce algorithm, the fused norm, the all-gather, the all-to-all, the LM head
/// and the MoE finalize.
const Path kEveryPath[] = {
    {"lamport", {Call::kAllReduce, DType::kBF16, 8 * 4096}},
    {"lamport_two_shot", {Call::kAllReduce, DType::kBF16, 8 * 4096}},
    {"one_shot", {Call::kAllReduce, DType::kBF16, 8 * 4096}},
    {"two_shot", {Call::kAllReduce, DType::kBF16, 8 * 4096}},
    {"auto", {Call::kFused, DType::kBF16, 8 * 7168, 7168}},
    {"auto", {Call::kAllGather, DType::kBF16, 8 * 4096}},
    {"auto", {Call::kAllToAll, DType::kBF16, 8 * 4096}},
    {"auto", {Call::kLmHead, DType::kBF16, 8 * 1024, 1024}},
    {"auto", {Call::kMoe, DType::kBF16, 2 * 7168, 7168}},
};

/// Elements of the `count` elements of `dtype` at `p` that are not NaN (f32, f16, bf16).
std::size_t not_nan(const void* p, std::int64_t count, DType dtype) {
  const auto bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  const std::vector<unsigned char> h = to_host(p, bytes);
  std::size_t n = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      std::uint32_t v;
      std::memcpy(&v, h.data() + 4 * i, 4);
      n += (v & 0x7F800000u) == 0x7F800000u && (v & 0x7FFFFFu) != 0 ? 0 : 1;
    } else {
      std::uint16_t v;
      std::memcpy(&v, h.data() + 2 * i, 2);
      const bool nan = dtype == DType::kBF16 ? (v & 0x7F80u) == 0x7F80u && (v & 0x7Fu) != 0
                                             : (v & 0x7C00u) == 0x7C00u && (v & 0x3FFu) != 0;
      n += nan ? 0 : 1;
    }
  }
  return n;
}

/// Elements of a call's output (`out`; norm_out for the fused call) that are not NaN.
std::size_t not_poisoned(const Buffers& b, const Call& c, int world) {
  return not_nan(b.out.get(), c.count * (c.kind == Call::kAllGather ? world : 1), c.dtype);
}

/// The pairs of calls an outside probe found returning values instead of errors.
struct Mismatch {
  const char* what;
  Call rank0, rank1;
};
const Mismatch kMismatches[] = {
    {"4096 vs 8192 elements",
     {Call::kAllReduce, DType::kBF16, 4096},
     {Call::kAllReduce, DType::kBF16, 8192}},
    {"4096 vs 4095 elements",
     {Call::kAllReduce, DType::kBF16, 4096},
     {Call::kAllReduce, DType::kBF16, 4095}},
    {"bf16 vs f32", {Call::kAllReduce, DType::kBF16, 4096}, {Call::kAllReduce, DType::kF32, 4096}},
    {"bf16 vs f16", {Call::kAllReduce, DType::kBF16, 4096}, {Call::kAllReduce, DType::kF16, 4096}},
    {"all-reduce vs fused",
     {Call::kAllReduce, DType::kBF16, 8 * 7168},
     {Call::kFused, DType::kBF16, 8 * 7168, 7168}},
    {"all-reduce vs all-gather",
     {Call::kAllReduce, DType::kBF16, 4096},
     {Call::kAllGather, DType::kBF16, 4096}},
    {"fused hidden 7168 vs 4096",
     {Call::kFused, DType::kBF16, 4 * 7168, 7168},
     {Call::kFused, DType::kBF16, 7 * 4096, 4096}},
    {"1 MiB vs 2 MiB",
     {Call::kAllReduce, DType::kBF16, 1 << 19},
     {Call::kAllReduce, DType::kBF16, 1 << 20}},
};

/// Whether `e` names rank `rank`'s call `what` ("rank 1 call 12 all_reduce 4096 bfloat16"),
/// with call number `call` where it is not 0.
bool names(const std::string& e, int rank, const std::string& what, std::uint32_t call = 0) {
  const std::string head = "rank " + std::to_string(rank) + " call ";
  for (std::size_t at = e.find(head); at != std::string::npos; at = e.find(head, at + 1)) {
    std::size_t end = at + head.size();
    while (end < e.size() && e[end] >= '0' && e[end] <= '9') ++end;
    if (end == at + head.size() || e.compare(end, 1 + what.size(), " " + what) != 0) continue;
    if (call == 0 || e.substr(at + head.size(), end - at - head.size()) == std::to_string(call))
      return true;
  }
  return false;
}

void expect_names_both(const Group& g, const Mismatch& m) {
  const std::string& e = g.last_error();
  EXPECT_TRUE(names(e, 0, m.rank0.describe())) << e;
  EXPECT_TRUE(names(e, 1, m.rank1.describe())) << e;
}

/// Runs `body(rank, group, buffers, stream, call)` on two virtual ranks for mismatch `m`, with a
/// fresh group (2 s deadline) and fresh buffers, `call` this rank's side of `m`.
template <class Body>
void for_each_rank(const Mismatch& m, Body&& body) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    StreamHolder stream;
    Buffers b;
    Options o = options_for("auto");
    o.timeout_ms = 2000;
    Group g(boot, 0, o);
    b.reset(stream.stream(), rank);
    body(rank, g, b, stream, rank == 0 ? m.rank0 : m.rank1);
    boot.barrier();
  });
}

// Each disagreement, eager: after one matching call, the ranks' next calls differ. Every rank's
// kernel gives up (at once where both took kernels of one kind, at the deadline otherwise),
// poisons its output, and the group fails with kMismatch naming both calls.
TEST(Faults, MismatchedEagerCallsFailEveryRankNamingBoth) {
  for (const Mismatch& m : kMismatches) {
    SCOPED_TRACE(m.what);
    for_each_rank(m, [&](int rank, Group& g, Buffers& b, StreamHolder& stream, const Call& mine) {
      ASSERT_EQ(issue(g, {Call::kAllReduce, DType::kBF16, 4096}, b, stream.stream()), Status::kOk)
          << g.last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
      b.reset(stream.stream(), rank);
      const auto start = Clock::now();
      ASSERT_EQ(issue(g, mine, b, stream.stream()), Status::kOk) << g.last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      EXPECT_LT(waited, 4.0);
      EXPECT_EQ(g.health(), Status::kMismatch) << g.last_error();
      expect_names_both(g, m);
      EXPECT_EQ(not_poisoned(b, mine, 2), 0u) << "output not poisoned";
      // The next call fails at once with the same status.
      EXPECT_EQ(issue(g, mine, b, stream.stream()), Status::kMismatch);
    });
  }
}

// The same disagreements captured: closing the capture scope compares the ranks' captured calls
// and fails every rank with kMismatch naming both; a graph replayed anyway only poisons.
TEST(Faults, MismatchedCapturedCallsFailWhenTheScopeCloses) {
  for (const Mismatch& m : kMismatches) {
    SCOPED_TRACE(m.what);
    for_each_rank(m, [&](int, Group& g, Buffers& b, StreamHolder& stream, const Call& mine) {
      cudaGraph_t graph = nullptr;
      Status closed = Status::kOk;
      {
        auto scope = g.capture(stream.stream());
        ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
                  cudaSuccess);
        ASSERT_EQ(issue(g, mine, b, stream.stream()), Status::kOk) << g.last_error();
        ASSERT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
        closed = scope.close();
      }
      EXPECT_EQ(closed, Status::kMismatch) << g.last_error();
      expect_names_both(g, m);
      EXPECT_EQ(g.health(), Status::kMismatch);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      // A graph whose kernels are all custom poisons; NCCL is not in a one-GPU group.
      EXPECT_EQ(not_poisoned(b, mine, 2), 0u) << "output not poisoned";
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    });
  }
}

// Calls out of step (NOTE [fingerprints]): the ranks capture the same call and replay it once
// together; then one rank replays it once more than the other (rank 1 skips a replay, or
// repeats one) before both make the same call eagerly. The replayed call (the number it was
// captured with) meets the peer's eager call (a later number): every rank fails with
// kMismatch at that call, naming both numbers, its outputs poisoned, well before the deadline.
// For every path (`kEveryPath`).
TEST(Faults, CallsOutOfStepFailEveryRankAtThatCall) {
  for (const Path& k : kEveryPath) {
    for (const bool repeat : {false, true}) {
      SCOPED_TRACE(std::string(k.algo) + " " + k.call.describe() +
                   (repeat ? ": rank 1 repeats a replay" : ": rank 1 skips a replay"));
      run_ranks(2, [&](int rank, Bootstrap& boot) {
        StreamHolder stream;
        Buffers b;
        Options o = options_for(k.algo);
        o.timeout_ms = 2000;
        Group g(boot, 0, o);
        b.reset(stream.stream(), rank);
        const testing::CapturedGraph graph(g, stream.stream(), [&] {
          ASSERT_EQ(issue(g, k.call, b, stream.stream()), Status::kOk) << g.last_error();
        });  // call 1
        ASSERT_TRUE(graph.ok());
        ASSERT_EQ(graph.launch(), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
        boot.barrier();
        const auto start = Clock::now();
        // Rank 0 replays once more, or rank 1 does: the other's eager call meets that replay.
        if (rank == (repeat ? 1 : 0)) {
          ASSERT_EQ(graph.launch(), cudaSuccess);
        }
        b.reset(stream.stream(), rank);
        ASSERT_EQ(issue(g, k.call, b, stream.stream()), Status::kOk) << g.last_error();  // call 2
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.0)
            << "found at the deadline, not at the call";
        EXPECT_EQ(g.health(), Status::kMismatch) << g.last_error();
        const std::string& e = g.last_error();
        const int replaying = repeat ? 1 : 0;
        EXPECT_NE(e.find("out of step"), std::string::npos) << e;
        EXPECT_TRUE(names(e, replaying, k.call.describe(), 1)) << e;
        EXPECT_TRUE(names(e, 1 - replaying, k.call.describe(), 2)) << e;
        EXPECT_EQ(not_poisoned(b, k.call, 2), 0u) << "output not poisoned";
        boot.barrier();
      });
    }
  }
}

// The check that comes before an eager call NCCL serves (CustomAllReduce::check_call; NCCL
// itself cannot run two ranks on one GPU, so the check is run alone here): one barrier that
// moves nothing, its flags carrying the keyed fingerprint. The same call passes on every rank;
// another call, or the same call out of step, fails both ranks with kMismatch naming both, at
// once.
TEST(Faults, TheCheckBeforeNcclComparesTheCalls) {
  const std::uint64_t big = fingerprint(Op::kAllReduce, DType::kBF16, std::int64_t{1} << 25);
  const std::uint64_t other = fingerprint(Op::kAllGather, DType::kBF16, std::int64_t{1} << 24);
  struct Case {
    const char* what;
    CallTag rank0, rank1;
    Status want;
    const char* says;
  };
  const Case cases[] = {
      {"the same call", {big, 7}, {big, 7}, Status::kOk, ""},
      {"another call",
       {big, 7},
       {other, 7},
       Status::kMismatch,
       "rank 1 call 7 all_gather 16777216 bfloat16"},
      {"out of step", {big, 8}, {big, 7}, Status::kMismatch, "out of step"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    run_ranks(2, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      Options o = options_for("auto");
      o.timeout_ms = 2000;
      std::string why;
      auto custom = CustomAllReduce::create(boot, 0, o, &why);
      ASSERT_NE(custom, nullptr) << why;
      ASSERT_EQ(custom->warm_up(stream.stream()), Status::kOk) << custom->error_message();
      boot.barrier();
      const auto start = Clock::now();
      ASSERT_EQ(custom->check_call(rank == 0 ? c.rank0 : c.rank1, stream.stream()), Status::kOk);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.0);
      EXPECT_EQ(custom->health(), c.want) << custom->error_message();
      EXPECT_NE(custom->error_message().find(c.says), std::string::npos) << custom->error_message();
      boot.barrier();
    });
  }
}

// Signed integers are poisoned with their most negative value, not -1 (the "none" of token and
// expert ids): an int32 and an int64 all-gather whose peer never calls.
TEST(Faults, SignedIntegersArePoisonedWithTheirMostNegativeValue) {
  for (const DType dtype : {DType::kI32, DType::kI64}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    run_ranks(2, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      Buffers b;
      Options o = options_for("auto");
      o.timeout_ms = 300;
      Group g(boot, 0, o);
      b.reset(stream.stream(), rank);
      ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk);
      const std::int64_t count = 1024;
      if (rank == 0) {
        ASSERT_EQ(issue(g, {Call::kAllGather, dtype, count}, b, stream.stream()), Status::kOk);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_EQ(g.health(), Status::kTimeout) << g.last_error();
        const std::vector<unsigned char> h =
            to_host(b.out.get(), static_cast<std::size_t>(2 * count) * dtype_size(dtype));
        std::size_t wrong = 0;
        for (std::int64_t i = 0; i < 2 * count; ++i) {
          if (dtype == DType::kI32) {
            std::int32_t v;
            std::memcpy(&v, h.data() + 4 * i, 4);
            wrong += v == std::numeric_limits<std::int32_t>::min() ? 0 : 1;
          } else {
            std::int64_t v;
            std::memcpy(&v, h.data() + 8 * i, 8);
            wrong += v == std::numeric_limits<std::int64_t>::min() ? 0 : 1;
          }
        }
        EXPECT_EQ(wrong, 0u) << "elements not poisoned with the most negative value";
      }
      boot.barrier();
    });
  }
}

/// What the rank that stays sees of a peer that stops replaying.
struct Report {
  std::mutex m;
  Status status = Status::kOk;
  std::string message;
  int calls = 0;
  Clock::time_point at;
};

// A peer that stops in the middle of graph replays (here: its thread stops launching): the
// survivor's first replay after it gives up at the deadline, the watchdog calls the handler
// within the bounds without any call from the caller, and every replay's outputs, that one's
// and all after it, are poisoned. For every path (`kEveryPath`).
TEST(Faults, GraphReplaysAfterAPeerStopsArePoisonedAndReported) {
  constexpr int kDeadlineMs = 1000;
  for (const Path& k : kEveryPath) {
    SCOPED_TRACE(std::string(k.algo) + " " + k.call.describe());
    Report report;
    run_ranks(2, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      Buffers b;
      Options o = options_for(k.algo);
      o.timeout_ms = kDeadlineMs;
      Group g(boot, 0, o);
      if (rank == 0)
        g.set_failure_mode(FailureMode::kCallback, [&](Status s, const std::string& message) {
          std::lock_guard lock(report.m);
          ++report.calls;
          report.status = s;
          report.message = message;
          report.at = Clock::now();
        });
      b.reset(stream.stream(), rank);
      const testing::CapturedGraph graph(g, stream.stream(), [&] {
        for (int i = 0; i < 4; ++i)
          ASSERT_EQ(issue(g, k.call, b, stream.stream()), Status::kOk) << g.last_error();
      });
      ASSERT_TRUE(graph.ok());
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(graph.launch(), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_EQ(
            not_poisoned(b, k.call, 2),
            static_cast<std::size_t>(k.call.count * (k.call.kind == Call::kAllGather ? 2 : 1)))
            << "replay " << i;
      }
      EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
      boot.barrier();
      if (rank == 0) {
        // Rank 1 launches nothing more.
        const auto fault = Clock::now();
        for (int i = 0; i < 5; ++i) {
          ASSERT_EQ(graph.launch(), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          EXPECT_EQ(not_poisoned(b, k.call, 2), 0u) << "replay " << i;
        }
        const double replays_s = std::chrono::duration<double>(Clock::now() - fault).count();
        EXPECT_LT(replays_s, 3.0 * kDeadlineMs / 1000) << "replays after the first wait again";
        // The handler ran by itself, within the deadline and the watchdog's period.
        const auto deadline = fault + std::chrono::milliseconds(kDeadlineMs + 500);
        while (Clock::now() < deadline) {
          std::lock_guard lock(report.m);
          if (report.calls > 0) break;
        }
        std::lock_guard lock(report.m);
        EXPECT_EQ(report.calls, 1);
        EXPECT_EQ(report.status, Status::kTimeout) << report.message;
        EXPECT_NE(report.message.find("waiting for rank 1"), std::string::npos) << report.message;
        EXPECT_LT(std::chrono::duration<double>(report.at - fault).count(),
                  kDeadlineMs / 1000.0 + 0.5);
        std::printf("%s: handler called %.3f s after the fault: %s\n", k.call.describe().c_str(),
                    std::chrono::duration<double>(report.at - fault).count(),
                    report.message.c_str());
        EXPECT_EQ(g.health(), Status::kTimeout);
      }
    });
  }
}

// Teardown: the watchdog takes the process down with the failure's message, as PyTorch's
// process groups do, though the caller never calls again. In a child process of its own.
TEST(FaultsDeathTest, TeardownTakesTheProcessDown) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        run_ranks(2, [](int rank, Bootstrap& boot) {
          StreamHolder stream;
          Buffers b;
          Options o = options_for("lamport");
          o.timeout_ms = 500;
          o.failure_mode = FailureMode::kTeardown;
          Group g(boot, 0, o);
          b.reset(stream.stream(), rank);
          ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk);
          if (rank == 0) (void)issue(g, {Call::kAllReduce, DType::kBF16, 4096}, b, stream.stream());
          std::this_thread::sleep_for(std::chrono::seconds(10));
        });
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGABRT), "taking the process down");
}

}  // namespace
}  // namespace tpcomm
