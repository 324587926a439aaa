// SPDX-License-Identifier: Apache-2.0
// The whole Group across processes: started by `tpcomm launch -n N`, one process per rank,
// one GPU per rank where there are enough GPUs, else all on GPU 0 (time-sliced: keep the
// number of operations small). Real IPC handles, registration after capture, NCCL where it can
// run (one GPU per rank), and a peer that dies.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::StreamHolder;

Bootstrap* g_boot = nullptr;
int g_device = 0;
bool g_gpu_per_rank = false;

Options mgpu_options(const std::string& algo) {
  Options o = Options::from_env();
  o.algo = algo;
  o.custom_ar_max_bytes = 4 << 20;
  return o;
}

/// Sum over ranks of the wrong elements of `out`.
std::uint64_t count_wrong(const void* out, DType t, std::int64_t count, std::uint64_t seed,
                          kernels::Collective coll, int root, Stream s,
                          ReduceOp op = ReduceOp::kSum) {
  DeviceBuffer wrong(8);
  EXPECT_EQ(cudaMemsetAsync(wrong.get(), 0, 8, reinterpret_cast<cudaStream_t>(s)), cudaSuccess);
  EXPECT_EQ(kernels::check_data(out, t, count, seed, g_boot->rank(), g_boot->world_size(), op, coll,
                                root, static_cast<unsigned long long*>(wrong.get()), s),
            Status::kOk);
  EXPECT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)), cudaSuccess);
  std::uint64_t mine = 0;
  cudaMemcpy(&mine, wrong.get(), 8, cudaMemcpyDeviceToHost);
  std::uint64_t total = 0;
  for (std::uint64_t w : g_boot->all_gather_value(mine)) total += w;
  return total;
}

/// FNV-1a of device bytes, to compare outputs across processes.
std::uint64_t digest(const void* p, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
  std::uint64_t x = 1469598103934665603ull;
  for (unsigned char c : h) x = (x ^ c) * 1099511628211ull;
  return x;
}

TEST(MultiProcess, ExactAllReduceEveryAlgorithm) {
  const int rank = g_boot->rank();
  StreamHolder stream;
  for (const char* algo : {"one_shot", "two_shot", "lamport", "lamport_two_shot"}) {
    Group g(*g_boot, g_device, mgpu_options(algo));
    for (auto [count, dtype] : {std::pair<std::int64_t, DType>{1, DType::kBF16},
                                {1001, DType::kF16},
                                {100003, DType::kBF16},
                                {(1 << 20) - 3, DType::kF32}}) {
      const std::size_t es = dtype_size(dtype);
      DeviceBuffer in((count + 8) * es), out((count + 8) * es);
      const std::uint64_t seed = 77 + static_cast<std::uint64_t>(count);
      ASSERT_EQ(kernels::fill_data(in.get(), dtype, count, seed, rank, ReduceOp::kSum, 0,
                                   stream.stream()),
                Status::kOk);
      ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), stream.stream()),
                Status::kOk);
      ASSERT_EQ(g.all_reduce(TensorView::flat(in.get(), dtype, count, g_device),
                             TensorView::flat(out.get(), dtype, count, g_device), stream.stream()),
                Status::kOk)
          << g.last_error();
      EXPECT_EQ(count_wrong(out.get(), dtype, count, seed, kernels::Collective::kAllReduce, 0,
                            stream.stream()),
                0u)
          << algo << " count " << count;
      EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
      const auto digests =
          g_boot->all_gather_value(digest(out.get(), static_cast<std::size_t>(count) * es));
      for (std::uint64_t d : digests) EXPECT_EQ(d, digests[0]) << "outputs differ across ranks";
    }
  }
}

// The fused all-reduce + residual add + RMSNorm across processes, on each fused algorithm and on
// the fallback: with a residual of zeros, residual_out is the exact all-reduce; norm_out is
// finite and bitwise the same on every rank.
TEST(MultiProcess, FusedAddRmsNorm) {
  const int rank = g_boot->rank();
  StreamHolder stream;
  const Stream s = stream.stream();
  // The last group carries no fusion workspace: all-reduce, then the local add + RMSNorm.
  for (auto [algo, fusion] : {std::pair<const char*, bool>{"lamport", true},
                              {"lamport_two_shot", true},
                              {"auto", false}}) {
    Group g(*g_boot, g_device, mgpu_options(algo), GroupConfig{true, true, fusion});
    for (auto [tokens, hidden] :
         {std::pair<std::int64_t, std::int64_t>{1, 4096}, {17, 2880}, {5, 7}}) {
      const std::int64_t count = tokens * hidden;
      DeviceBuffer x(count * 2), residual(count * 2), gamma(hidden * 2), norm(count * 2),
          out(count * 2);
      const std::uint64_t seed = 500 + static_cast<std::uint64_t>(count);
      ASSERT_EQ(kernels::fill_data(x.get(), DType::kBF16, count, seed, rank, ReduceOp::kSum, 0, s),
                Status::kOk);
      ASSERT_EQ(
          kernels::fill_data(gamma.get(), DType::kBF16, hidden, seed, 0, ReduceOp::kSum, 0, s),
          Status::kOk);
      ASSERT_EQ(cudaMemsetAsync(residual.get(), 0, residual.size(), stream.get()), cudaSuccess);
      for (DeviceBuffer* b : {&norm, &out})
        ASSERT_EQ(kernels::poison(b->get(), static_cast<std::int64_t>(b->size()), s), Status::kOk);
      auto rows = [&](const DeviceBuffer& b) {
        return TensorView::contiguous(b.get(), DType::kBF16, {tokens, hidden}, g_device);
      };
      ASSERT_EQ(
          g.all_reduce_add_rmsnorm(rows(x), rows(residual),
                                   TensorView::flat(gamma.get(), DType::kBF16, hidden, g_device),
                                   1e-6f, rows(norm), rows(out), s),
          Status::kOk)
          << g.last_error();
      EXPECT_EQ(
          count_wrong(out.get(), DType::kBF16, count, seed, kernels::Collective::kAllReduce, 0, s),
          0u)
          << algo << " " << tokens << "x" << hidden << " on "
          << g.backend_for_add_rmsnorm(rows(x), rows(norm));
      EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
      std::vector<std::uint16_t> host(static_cast<std::size_t>(count));
      ASSERT_EQ(cudaMemcpy(host.data(), norm.get(), host.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      int not_finite = 0;
      for (std::uint16_t v : host) not_finite += (v & 0x7F80u) == 0x7F80u ? 1 : 0;
      EXPECT_EQ(not_finite, 0) << algo;
      const auto digests = g_boot->all_gather_value(digest(norm.get(), host.size() * 2));
      for (std::uint64_t d : digests) EXPECT_EQ(d, digests[0]) << "norm_out differs across ranks";
    }
  }
}

// The Lamport kernels push into peers' buffers through IPC mappings and rotate three buffers:
// back-to-back operations of changing sizes, queued without waiting, are each exact.
TEST(MultiProcess, LamportBackToBack) {
  const int rank = g_boot->rank();
  const std::int64_t sizes[] = {4096, 8, 100000, 1000, 65536, 3};
  StreamHolder stream;
  for (const char* algo : {"lamport", "lamport_two_shot"}) {
    Group g(*g_boot, g_device, mgpu_options(algo));
    std::vector<std::unique_ptr<DeviceBuffer>> ins, outs;
    const int ops = 12;
    for (int i = 0; i < ops; ++i) {
      const std::int64_t n = sizes[i % std::size(sizes)];
      ins.push_back(std::make_unique<DeviceBuffer>(n * 2));
      outs.push_back(std::make_unique<DeviceBuffer>(n * 2));
      ASSERT_EQ(kernels::fill_data(ins.back()->get(), DType::kBF16, n, 900 + i, rank,
                                   ReduceOp::kSum, 0, stream.stream()),
                Status::kOk);
      ASSERT_EQ(kernels::poison(outs.back()->get(), n * 2, stream.stream()), Status::kOk);
    }
    for (int i = 0; i < ops; ++i) {
      const std::int64_t n = sizes[i % std::size(sizes)];
      ASSERT_EQ(g.all_reduce(TensorView::flat(ins[i]->get(), DType::kBF16, n, g_device),
                             TensorView::flat(outs[i]->get(), DType::kBF16, n, g_device),
                             stream.stream()),
                Status::kOk)
          << g.last_error();
    }
    for (int i = 0; i < ops; ++i) {
      const std::int64_t n = sizes[i % std::size(sizes)];
      EXPECT_EQ(count_wrong(outs[i]->get(), DType::kBF16, n, 900 + i,
                            kernels::Collective::kAllReduce, 0, stream.stream()),
                0u)
          << algo << " operation " << i;
    }
    EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
  }
}

// Buffers used inside a captured graph are registered when the scope closes: real IPC handles
// of the caller's allocations, opened by every peer process.
TEST(MultiProcess, RegistrationAfterCapture) {
  const int rank = g_boot->rank();
  Options o = mgpu_options("two_shot");
  o.custom_ar_register_min_bytes = 0;
  Group g(*g_boot, g_device, o);
  StreamHolder stream;
  const std::int64_t count = 65536 + 11;
  DeviceBuffer in(count * 2 + 64), out(count * 2 + 64);
  const testing::CapturedGraph graph(g, stream.stream(), [&] {
    ASSERT_EQ(
        g.all_reduce(TensorView::flat(in.get(), DType::kBF16, count, g_device),
                     TensorView::flat(out.get(), DType::kBF16, count, g_device), stream.stream()),
        Status::kOk);
  });
  ASSERT_TRUE(graph.ok());
  for (int replay = 0; replay < 2; ++replay) {
    const std::uint64_t seed = 9000 + static_cast<std::uint64_t>(replay);
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, count, seed, rank, ReduceOp::kSum, 0,
                                 stream.stream()),
              Status::kOk);
    ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), stream.stream()),
              Status::kOk);
    ASSERT_EQ(graph.launch(), cudaSuccess);
    EXPECT_EQ(count_wrong(out.get(), DType::kBF16, count, seed, kernels::Collective::kAllReduce, 0,
                          stream.stream()),
              0u)
        << "replay " << replay;
    EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
  }
}

/// Sum over ranks of the wrong elements of this rank's LM-head exchange output.
std::uint64_t lm_head_wrong(const void* out, DType t, std::int64_t rows, std::int64_t vocab,
                            std::int64_t cols, std::int64_t first, std::uint64_t seed, Stream s) {
  DeviceBuffer wrong(8);
  EXPECT_EQ(cudaMemsetAsync(wrong.get(), 0, 8, reinterpret_cast<cudaStream_t>(s)), cudaSuccess);
  EXPECT_EQ(kernels::check_lm_head(out, t, rows, vocab, cols, first, seed,
                                   static_cast<unsigned long long*>(wrong.get()), s),
            Status::kOk);
  EXPECT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)), cudaSuccess);
  std::uint64_t mine = 0;
  cudaMemcpy(&mine, wrong.get(), 8, cudaMemcpyDeviceToHost);
  std::uint64_t total = 0;
  for (std::uint64_t w : g_boot->all_gather_value(mine)) total += w;
  return total;
}

// The LM-head exchange across processes (IPC-mapped staging, and inputs registered after
// capture; the push form into IPC-mapped Lamport buffers where pinned), per-rank rows with a rank
// holding none, the fallback through the all-gather; and the plain all-gather and all-to-all
// over peer memory.
TEST(MultiProcess, LmHeadExchangeAndExchanges) {
  const int rank = g_boot->rank();
  const int world = g_boot->world_size();
  StreamHolder stream;
  const Stream s = stream.stream();
  const std::int64_t vocab = 129280;
  const std::int64_t cols = (vocab + world - 1) / world;
  // The LM head's exchange (the built-in choice, then the push form pinned), and the fallback.
  struct Config {
    Switch a2a;
    const char* exchange;
  };
  for (const Config cfg : {Config{Switch::kAuto, "auto"}, Config{Switch::kAuto, "push"},
                           Config{Switch::kOff, "auto"}}) {
    const Switch a2a = cfg.a2a;
    // Either form: the push form where the parts fit its slots (pinned, or within its built-in
    // bounds), the pull form elsewhere.
    auto custom_path = [&](const std::string& path) {
      return path == "custom_ar:pull" || path == "custom_ar:push";
    };
    Options o = mgpu_options("auto");
    o.lm_head_a2a = a2a;
    o.exchange_algo = cfg.exchange;
    // Captured exchanges read the inputs in place (IPC-registered when the scope closes).
    o.custom_ar_register_min_bytes = 0;
    Group g(*g_boot, g_device, o);
    g.prepare_exchange();
    for (bool equal : {true, false}) {
      std::vector<std::int64_t> rows(static_cast<std::size_t>(world), 7);
      if (!equal)
        for (int r = 0; r < world; ++r) rows[static_cast<std::size_t>(r)] = r == 1 ? 0 : 3 + 2 * r;
      std::int64_t total = 0;
      std::int64_t first = 0;
      for (int r = 0; r < world; ++r) {
        if (r == rank) first = total;
        total += rows[static_cast<std::size_t>(r)];
      }
      const std::int64_t mine = rows[static_cast<std::size_t>(rank)];
      const LmHeadLayout layout = equal ? LmHeadLayout::equal(7) : LmHeadLayout::counts(rows);
      DeviceBuffer in(total * cols * 2), out(std::max<std::int64_t>(mine, 1) * vocab * 2);
      const auto shards = TensorView::contiguous(in.get(), DType::kBF16, {total, cols}, g_device);
      const auto result = TensorView::contiguous(out.get(), DType::kBF16, {mine, vocab}, g_device);
      const std::string path = g.backend_for_lm_head_exchange(shards, result, layout);
      if (a2a == Switch::kOff) {  // the all-gather in either form, then the copy
        EXPECT_TRUE(path == "all_gather:custom_ar:pull+copy" ||
                    path == "all_gather:custom_ar:push+copy")
            << path;
      } else {
        EXPECT_TRUE(custom_path(path)) << path;
      }
      // Eager.
      const std::uint64_t seed = 7100 + (equal ? 0u : 1u);
      ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, total * cols, seed, rank, ReduceOp::kSum,
                                   0, s),
                Status::kOk);
      ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), s), Status::kOk);
      ASSERT_EQ(g.lm_head_exchange(shards, result, layout, s), Status::kOk) << g.last_error();
      EXPECT_EQ(lm_head_wrong(out.get(), DType::kBF16, mine, vocab, cols, first, seed, s), 0u)
          << path << (equal ? " equal" : " uneven");
      // Captured once, replayed with new data.
      const testing::CapturedGraph graph(g, s, [&] {
        ASSERT_EQ(g.lm_head_exchange(shards, result, layout, s), Status::kOk) << g.last_error();
      });
      ASSERT_TRUE(graph.ok());
      for (int replay = 0; replay < 2; ++replay) {
        const std::uint64_t fresh = seed + 10 + static_cast<std::uint64_t>(replay);
        ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, total * cols, fresh, rank,
                                     ReduceOp::kSum, 0, s),
                  Status::kOk);
        ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), s),
                  Status::kOk);
        ASSERT_EQ(graph.launch(), cudaSuccess);
        EXPECT_EQ(lm_head_wrong(out.get(), DType::kBF16, mine, vocab, cols, first, fresh, s), 0u)
            << path << " replay " << replay;
        EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
      }
    }
    // The plain exchanges over the same peer memory.
    const std::int64_t n = 100003;
    DeviceBuffer in(n * world * 4), out(n * world * 4);
    for (kernels::Collective c :
         {kernels::Collective::kAllGather, kernels::Collective::kAllToAll}) {
      const bool gather = c == kernels::Collective::kAllGather;
      const std::int64_t in_count = gather ? n : n * world;
      const auto iv = TensorView::flat(in.get(), DType::kF32, in_count, g_device);
      const auto ov = TensorView::flat(out.get(), DType::kF32, n * world, g_device);
      const std::string path =
          gather ? g.backend_for_all_gather(iv, ov) : g.backend_for_all_to_all(iv, ov);
      EXPECT_TRUE(custom_path(path)) << path;
      ASSERT_EQ(kernels::fill_data(in.get(), DType::kF32, in_count, 77, rank, ReduceOp::kSum, 0, s),
                Status::kOk);
      ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), s), Status::kOk);
      ASSERT_EQ(gather ? g.all_gather(iv, ov, s) : g.all_to_all(iv, ov, s), Status::kOk)
          << g.last_error();
      EXPECT_EQ(count_wrong(out.get(), DType::kF32, n * world, 77, c, 0, s), 0u)
          << (gather ? "all_gather" : "all_to_all");
    }
  }
}

// NCCL through the group: every collective exact. Needs one GPU per rank (NCCL refuses two
// ranks on one GPU).
TEST(MultiProcess, NcclCollectivesThroughTheGroup) {
  if (!g_gpu_per_rank) GTEST_SKIP() << "ranks share a GPU: NCCL refuses that";
  const int rank = g_boot->rank();
  const int world = g_boot->world_size();
  Group g(*g_boot, g_device, mgpu_options("nccl"));
  StreamHolder stream;
  const std::int64_t per = 4099;
  DeviceBuffer in(per * world * 4 + 64), out(per * world * 4 + 64);
  auto run = [&](kernels::Collective coll, std::int64_t in_count, std::int64_t out_count,
                 auto&& call, int root = 0) {
    const std::uint64_t seed = 300 + static_cast<std::uint64_t>(coll);
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kF32, in_count, seed, rank, ReduceOp::kSum, 0,
                                 stream.stream()),
              Status::kOk);
    ASSERT_EQ(kernels::poison(out.get(), static_cast<std::int64_t>(out.size()), stream.stream()),
              Status::kOk);
    ASSERT_EQ(call(TensorView::flat(in.get(), DType::kF32, in_count, g_device),
                   TensorView::flat(out.get(), DType::kF32, out_count, g_device)),
              Status::kOk)
        << g.last_error();
    EXPECT_EQ(count_wrong(out.get(), DType::kF32, out_count, seed, coll, root, stream.stream()), 0u)
        << "collective " << static_cast<int>(coll);
  };
  run(kernels::Collective::kAllReduce, per, per,
      [&](auto i, auto o) { return g.all_reduce(i, o, stream.stream()); });
  run(kernels::Collective::kAllGather, per, per * world,
      [&](auto i, auto o) { return g.all_gather(i, o, stream.stream()); });
  run(kernels::Collective::kReduceScatter, per * world, per,
      [&](auto i, auto o) { return g.reduce_scatter(i, o, stream.stream()); });
  run(kernels::Collective::kAllToAll, per * world, per * world,
      [&](auto i, auto o) { return g.all_to_all(i, o, stream.stream()); });
  run(
      kernels::Collective::kBroadcast, per, per,
      [&](auto i, auto o) { return g.broadcast(i, o, world - 1, stream.stream()); }, world - 1);
}

// A deterministic group where NCCL can run (one GPU per rank): `strict` refuses, on every rank
// and before launching anything, an all-reduce or a fused call that NCCL would reduce (past the
// custom kernels' workspace), naming its size and the limit, and the group stays usable; `on`
// serves the same calls (NCCL's sum, exact on integer data), as a default group does. The plain
// reduce-scatter is not refused. The sequence-parallel fused norm sums by the custom all-reduce in
// a deterministic group, by NCCL's reduce-scatter in a default one: served and exact in all three.
TEST(MultiProcess, DeterministicGroupsWhereNcclReduces) {
  if (!g_gpu_per_rank) GTEST_SKIP() << "ranks share a GPU: NCCL refuses that";
  const int rank = g_boot->rank();
  const int world = g_boot->world_size();
  StreamHolder stream;
  const Stream s = stream.stream();
  const std::int64_t big = std::int64_t{4} << 20;  // bf16 elements: 8 MiB, past 4 MiB
  const std::int64_t hidden = 4096;
  DeviceBuffer in(big * 2 + 64), out(big * 2 + 64), residual(big * 2 + 64), gamma(hidden * 2);
  ASSERT_EQ(cudaMemset(gamma.get(), 0, hidden * 2), cudaSuccess);
  for (const Determinism mode : {Determinism::kStrict, Determinism::kOn, Determinism::kOff}) {
    const bool strict = mode == Determinism::kStrict;
    SCOPED_TRACE(to_string(mode));
    Options o = mgpu_options("auto");
    o.deterministic = mode;
    Group g(*g_boot, g_device, o);
    const auto x = TensorView::flat(in.get(), DType::kBF16, big, g_device);
    const auto y = TensorView::flat(out.get(), DType::kBF16, big, g_device);
    ASSERT_EQ(g.backend_for_all_reduce(x, y), "nccl");
    const std::uint64_t seed = 900 + static_cast<std::uint64_t>(mode);
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, big, seed, rank, ReduceOp::kSum, 0, s),
              Status::kOk);
    ASSERT_EQ(kernels::poison(out.get(), big * 2, s), Status::kOk);
    const Status st = g.all_reduce(x, y, s);
    if (strict) {
      EXPECT_EQ(st, Status::kInvalidArgument);
      EXPECT_NE(g.last_error().find("TPCOMM_DETERMINISTIC=strict"), std::string::npos)
          << g.last_error();
      EXPECT_NE(g.last_error().find(std::to_string(big * 2) + " bytes"), std::string::npos)
          << g.last_error();
      EXPECT_EQ(g.health(), Status::kOk) << "a refused call does not fail the group";
      // Nothing was written: the output is still the poison on every rank.
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      DeviceBuffer poisoned(big * 2);
      ASSERT_EQ(kernels::poison(poisoned.get(), big * 2, s), Status::kOk);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      EXPECT_EQ(digest(out.get(), big * 2), digest(poisoned.get(), big * 2));
    } else {
      ASSERT_EQ(st, Status::kOk) << g.last_error();
      EXPECT_EQ(
          count_wrong(out.get(), DType::kBF16, big, seed, kernels::Collective::kAllReduce, 0, s),
          0u);
    }
    // What the custom kernels hold is served alike in both modes.
    const auto small_x = TensorView::flat(in.get(), DType::kBF16, 4096, g_device);
    const auto small_y = TensorView::flat(out.get(), DType::kBF16, 4096, g_device);
    ASSERT_EQ(g.all_reduce(small_x, small_y, s), Status::kOk) << g.last_error();
    EXPECT_EQ(
        count_wrong(out.get(), DType::kBF16, 4096, seed, kernels::Collective::kAllReduce, 0, s),
        0u);
    // The plain reduce-scatter keeps no order either way: never refused.
    const std::int64_t per = 4096;
    ASSERT_EQ(
        kernels::fill_data(in.get(), DType::kBF16, per * world, seed, rank, ReduceOp::kSum, 0, s),
        Status::kOk);
    ASSERT_EQ(g.reduce_scatter(TensorView::flat(in.get(), DType::kBF16, per * world, g_device),
                               TensorView::flat(out.get(), DType::kBF16, per, g_device), s),
              Status::kOk)
        << g.last_error();
    EXPECT_EQ(
        count_wrong(out.get(), DType::kBF16, per, seed, kernels::Collective::kReduceScatter, 0, s),
        0u);
    // The sequence-parallel fused norm: x [world * 4, hidden], each rank its 4 rows. gamma is
    // zero, so norm_out is a signed zero; residual_out (residual zero) is this rank's rows of the
    // all-reduce, which the reduce-scatter's check reads.
    const std::int64_t rows = 4;
    ASSERT_EQ(kernels::fill_data(in.get(), DType::kBF16, rows * world * hidden, seed, rank,
                                 ReduceOp::kSum, 0, s),
              Status::kOk);
    ASSERT_EQ(
        cudaMemsetAsync(residual.get(), 0, rows * hidden * 2, reinterpret_cast<cudaStream_t>(s)),
        cudaSuccess);
    DeviceBuffer norm_out(rows * hidden * 2), residual_out(rows * hidden * 2);
    const auto mine = [&](const DeviceBuffer& b) {
      return TensorView::contiguous(b.get(), DType::kBF16, {rows, hidden}, g_device);
    };
    const Status fused = g.reduce_scatter_add_rmsnorm(
        TensorView::contiguous(in.get(), DType::kBF16, {rows * world, hidden}, g_device),
        mine(residual), TensorView::flat(gamma.get(), DType::kBF16, hidden, g_device), 1e-6f,
        mine(norm_out), mine(residual_out), s);
    ASSERT_EQ(fused, Status::kOk) << g.last_error();
    EXPECT_EQ(count_wrong(residual_out.get(), DType::kBF16, rows * hidden, seed,
                          kernels::Collective::kReduceScatter, 0, s),
              0u);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    EXPECT_EQ(g.health(), Status::kOk) << g.last_error();
    g_boot->barrier();
  }
}

// A peer that dies without any cleanup: the survivors' kernels give up within the deadline,
// the group names the rank that did not arrive, and tearing the group down stays bounded. A
// second group, whose stream the dead peer never warmed up, fails its first collective at the
// warm-up barrier instead (NOTE [first launch]), as clearly. Runs last (the dead rank is gone
// afterwards); only when TPCOMM_MGPU_DEAD_PEER=1.
TEST(MultiProcess, ZDeadPeerTimesOut) {
  if (std::getenv("TPCOMM_MGPU_DEAD_PEER") == nullptr)
    GTEST_SKIP() << "set TPCOMM_MGPU_DEAD_PEER=1";
  Options o = mgpu_options("one_shot");
  ASSERT_FALSE(o.rank_watch) << "set TPCOMM_RANK_WATCH=0: this test measures the deadline path";
  o.timeout_ms = 3000;
  const int victim = g_boot->world_size() - 1;
  auto g = std::make_unique<Group>(*g_boot, g_device, o);
  auto cold = std::make_unique<Group>(*g_boot, g_device, o);
  StreamHolder stream;
  DeviceBuffer in(8192), out(8192);
  ASSERT_EQ(g->warm_up(stream.stream()), Status::kOk) << g->last_error();
  g_boot->barrier();
  if (g_boot->rank() == victim) _exit(0);  // gone: no destructors, no goodbye
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(
      g->all_reduce(TensorView::flat(in.get(), DType::kBF16, 4096, g_device),
                    TensorView::flat(out.get(), DType::kBF16, 4096, g_device), stream.stream()),
      Status::kOk);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  EXPECT_EQ(g->health(), Status::kTimeout);
  EXPECT_NE(g->last_error().find("waiting for rank " + std::to_string(victim)), std::string::npos)
      << g->last_error();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_EQ(
      cold->all_reduce(TensorView::flat(in.get(), DType::kBF16, 4096, g_device),
                       TensorView::flat(out.get(), DType::kBF16, 4096, g_device), stream.stream()),
      Status::kTimeout);
  EXPECT_NE(cold->last_error().find("did not arrive"), std::string::npos) << cold->last_error();
  EXPECT_NE(cold->last_error().find("new stream"), std::string::npos) << cold->last_error();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0);
  cold.reset();
  g.reset();  // teardown with a dead peer: bounded by the store timeout
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 90.0);
}

// A rank's process killed in the middle of back-to-back all-reduces (TPCOMM_MGPU_KILL=<rank>,
// TPCOMM_MGPU_KILL_ALGO=<algorithm>; two ranks started by hand, since a launcher would stop the
// survivor): the survivor's next call fails within a second naming the rank, and the group is
// destroyed within two, at the default 30 s deadline (NOTE [rank watch]). With
// TPCOMM_MGPU_KILL_GRAPH=1 the survivor replays a graph of ten all-reduces in a loop and never
// asks the group anything: its watchdog notices by itself (TPCOMM_ASYNC_ERROR_HANDLING: callback,
// timed here; raise; teardown, which ends the process with SIGABRT), and every element of every
// replay's output is exact (zero) or poisoned (NaN), every replay after the first poisoned one
// wholly poisoned. TPCOMM_MGPU_KILL_SIGNAL=STOP stops the victim instead (SIGSTOP): the survivor
// is told at its deadline.
TEST(MultiProcess, ZRankKilledIsNoticed) {
  const char* victim_env = std::getenv("TPCOMM_MGPU_KILL");
  if (victim_env == nullptr) GTEST_SKIP() << "set TPCOMM_MGPU_KILL=<rank>";
  const int victim = std::atoi(victim_env);
  const char* algo = std::getenv("TPCOMM_MGPU_KILL_ALGO");
  const char* signal_env = std::getenv("TPCOMM_MGPU_KILL_SIGNAL");
  const bool stop = signal_env != nullptr && std::string(signal_env) == "STOP";
  Options o = mgpu_options(algo != nullptr ? algo : "auto");
  if (!stop) {
    ASSERT_EQ(o.timeout_ms, 30000) << "run at the default deadline";
  }
  auto g = std::make_unique<Group>(*g_boot, g_device, o);
  using Clock = std::chrono::steady_clock;
  std::mutex told_mu;
  std::optional<Clock::time_point> told;
  std::string told_message;
  if (o.failure_mode == FailureMode::kCallback)
    g->set_failure_mode(FailureMode::kCallback, [&](Status, const std::string& message) {
      std::lock_guard lock(told_mu);
      told = Clock::now();
      told_message = message;
    });
  StreamHolder stream;
  // TPCOMM_MGPU_KILL_OP: the operation replayed, all_reduce by default, or the fused norm, the
  // all-gather, the all-to-all, the LM head or the MoE finalize. Every input is zero, so every
  // exact output element is zero.
  const char* op_env = std::getenv("TPCOMM_MGPU_KILL_OP");
  const std::string op = op_env != nullptr ? op_env : "all_reduce";
  constexpr std::int64_t kCount = 8192;
  constexpr std::int64_t kHidden = 4096;
  // `in` holds the MoE finalize's experts too: two rows for each of its kCount / kHidden tokens.
  DeviceBuffer in(2 * kCount * 2), out(kCount * 2), residual(kCount * 2), gamma(kHidden * 2);
  DeviceBuffer moe_map(64), moe_weights(64);  // int32 and f32 [tokens, 2]: experts' row 0, weight 0
  for (DeviceBuffer* b : {&in, &out, &residual, &gamma, &moe_map, &moe_weights})
    ASSERT_EQ(cudaMemset(b->get(), 0, b->size()), cudaSuccess);
  ASSERT_EQ(g->warm_up(stream.stream()), Status::kOk) << g->last_error();
  g_boot->barrier();
  const int world = g_boot->world_size();
  const auto ar = [&] {
    const auto flat = [&](DeviceBuffer& b, std::int64_t n) {
      return TensorView::flat(b.get(), DType::kBF16, n, g_device);
    };
    if (op == "fused") {
      const auto x =
          TensorView::contiguous(out.get(), DType::kBF16, {kCount / kHidden, kHidden}, g_device);
      const auto r = TensorView::contiguous(residual.get(), DType::kBF16,
                                            {kCount / kHidden, kHidden}, g_device);
      return g->all_reduce_add_rmsnorm(x, r, flat(gamma, kHidden), 1e-6f, x, r, stream.stream());
    }
    if (op == "all_gather")
      return g->all_gather(flat(in, kCount / world), flat(out, kCount), stream.stream());
    if (op == "all_to_all")
      return g->all_to_all(flat(in, kCount), flat(out, kCount), stream.stream());
    if (op == "moe_finalize") {  // kCount / kHidden tokens of two experts each
      const std::int64_t tokens = kCount / kHidden;
      const MoeCombine moe{
          TensorView::contiguous(in.get(), DType::kBF16, {2 * tokens, kHidden}, g_device),
          TensorView::contiguous(moe_map.get(), DType::kI32, {tokens, 2}, g_device),
          TensorView::contiguous(moe_weights.get(), DType::kF32, {tokens, 2}, g_device),
          {}};
      const auto x = TensorView::contiguous(out.get(), DType::kBF16, {tokens, kHidden}, g_device);
      const auto r =
          TensorView::contiguous(residual.get(), DType::kBF16, {tokens, kHidden}, g_device);
      return g->moe_finalize_all_reduce_add_rmsnorm(moe, r, flat(gamma, kHidden), 1e-6f, x, r,
                                                    stream.stream());
    }
    if (op == "lm_head") {  // every rank's 4 rows on each shard, [4, kCount / 4] back
      const std::int64_t cols = kCount / (world * 4);
      return g->lm_head_exchange(
          TensorView::contiguous(in.get(), DType::kBF16, {world * 4, cols}, g_device),
          TensorView::contiguous(out.get(), DType::kBF16, {4, cols * world}, g_device),
          LmHeadLayout::equal(4), stream.stream());
    }
    return g->all_reduce(flat(in, kCount), flat(out, kCount), stream.stream());
  };
  const bool graph = std::getenv("TPCOMM_MGPU_KILL_GRAPH") != nullptr;
  const int fault_at = graph ? 20 : 200;
  auto fault = [&] { ::raise(stop ? SIGSTOP : SIGKILL); };
  if (graph) {
    cudaGraph_t captured = nullptr;
    auto scope = g->capture(stream.stream());
    ASSERT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
    for (int k = 0; k < 10; ++k) ASSERT_EQ(ar(), Status::kOk) << g->last_error();
    ASSERT_EQ(cudaStreamEndCapture(stream.get(), &captured), cudaSuccess);
    ASSERT_EQ(scope.close(), Status::kOk) << g->last_error();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, captured, 0), cudaSuccess);
    cudaGraphDestroy(captured);
    // Every element is zero (the exact sum) or NaN (poisoned), nothing else.
    std::vector<std::uint16_t> host(kCount);
    auto last_exact = Clock::now();
    std::optional<Clock::time_point> first_poisoned;
    int replays_poisoned = 0;
    for (int i = 0; i < 1000000; ++i) {
      if (g_boot->rank() == victim && i == fault_at) fault();
      ASSERT_EQ(cudaGraphLaunch(exec, stream.get()), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(host.data(), out.get(), kCount * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      int zero = 0, nan = 0;
      for (std::uint16_t v : host) {
        zero += v == 0 ? 1 : 0;
        nan += (v & 0x7F80u) == 0x7F80u && (v & 0x7Fu) != 0 ? 1 : 0;
      }
      ASSERT_EQ(zero + nan, kCount) << "replay " << i << ": an element neither exact nor NaN";
      if (first_poisoned) {
        ASSERT_EQ(nan, kCount) << "replay " << i << " after a poisoned one";
      }
      if (nan == 0) last_exact = Clock::now();
      if (nan > 0 && !first_poisoned) first_poisoned = Clock::now();
      if (nan > 0) ++replays_poisoned;
      // Teardown: replay until the watchdog takes the process down.
      bool done = replays_poisoned >= 20 && o.failure_mode != FailureMode::kTeardown;
      if (o.failure_mode == FailureMode::kCallback) {
        std::lock_guard lock(told_mu);
        done = done && told.has_value();
      }
      if (done) break;
      ASSERT_LT(Clock::now() - last_exact, std::chrono::seconds(20)) << "nothing after 20 s";
    }
    cudaGraphExecDestroy(exec);
    const double poisoned_s = std::chrono::duration<double>(*first_poisoned - last_exact).count();
    double told_s = -1;
    if (o.failure_mode == FailureMode::kCallback) {
      std::lock_guard lock(told_mu);
      told_s = std::chrono::duration<double>(*told - last_exact).count();
      EXPECT_LT(told_s, stop ? o.timeout_ms / 1000.0 + 1.0 : 1.0) << told_message;
    }
    // Raise (and callback): the group is failed, without a call having asked.
    const Status health = g->health();
    EXPECT_EQ(health, stop ? Status::kTimeout : Status::kAborted) << g->last_error();
    std::printf(
        "rank %d %s (%s %s, graph replays, %s): first poisoned replay %.3f s after the last "
        "exact one, %d poisoned replays, told %.3f s after: %s\n",
        victim, stop ? "stopped" : "killed", op.c_str(), o.algo.c_str(),
        std::string(to_string(o.failure_mode)).c_str(), poisoned_s, replays_poisoned, told_s,
        g->last_error().c_str());
    g.reset();
    return;
  }
  auto last_ok = Clock::now();
  Status failed = Status::kOk;
  for (int i = 0; i < 100000 && failed == Status::kOk; ++i) {
    if (g_boot->rank() == victim && i == fault_at) fault();
    failed = ar();
    if (failed == Status::kOk && i % 10 == 9) {
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      failed = g->health();
      if (failed == Status::kOk) last_ok = Clock::now();
    }
    ASSERT_LT(Clock::now() - last_ok, std::chrono::seconds(20)) << "no error after 20 s";
  }
  const auto noticed = Clock::now();
  EXPECT_EQ(failed, stop ? Status::kTimeout : Status::kAborted) << g->last_error();
  const std::string gone = "rank " + std::to_string(victim) + " left";
  if (!stop) {
    EXPECT_NE(g->last_error().find(victim == 0 ? "rank 0, or the process serving" : gone.c_str()),
              std::string::npos)
        << g->last_error();
  }
  const double notice_s = std::chrono::duration<double>(noticed - last_ok).count();
  EXPECT_LT(notice_s, stop ? o.timeout_ms / 1000.0 + 1.0 : 1.0);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  const std::string error = g->last_error();
  g.reset();
  const double teardown_s = std::chrono::duration<double>(Clock::now() - noticed).count();
  // A stopped peer holds the group's last barrier (before its memory is freed) to the deadline.
  EXPECT_LT(teardown_s, stop ? o.timeout_ms / 1000.0 + 1.0 : 2.0);
  std::printf(
      "rank %d %s (%s): error %.3f s after the last good call, group destroyed %.3f s "
      "later: %s\n",
      victim, stop ? "stopped" : "killed", o.algo.c_str(), notice_s, teardown_s, error.c_str());
}

// Ranks that call different collectives, across processes: the same size of different element
// counts (both Lamport), and an all-reduce against an all-gather (different kinds of kernel,
// noticed at a short deadline). Every rank fails with kMismatch naming both calls.
TEST(MultiProcess, MismatchedCallsFailEveryRank) {
  if (g_boot->world_size() != 2) GTEST_SKIP() << "two ranks";
  for (const bool kinds : {false, true}) {
    SCOPED_TRACE(kinds ? "all-reduce vs all-gather" : "4096 vs 8192 elements");
    Options o = mgpu_options("auto");
    o.timeout_ms = 3000;
    Group g(*g_boot, g_device, o);
    StreamHolder stream;
    DeviceBuffer in(8192 * 2), out(2 * 8192 * 2);
    ASSERT_EQ(cudaMemset(in.get(), 0, 8192 * 2), cudaSuccess);
    const int rank = g_boot->rank();
    const std::int64_t n = rank == 0 || kinds ? 4096 : 8192;
    Status s;
    if (kinds && rank == 1)
      s = g.all_gather(TensorView::flat(in.get(), DType::kBF16, n, g_device),
                       TensorView::flat(out.get(), DType::kBF16, 2 * n, g_device), stream.stream());
    else
      s = g.all_reduce(TensorView::flat(in.get(), DType::kBF16, n, g_device),
                       TensorView::flat(out.get(), DType::kBF16, n, g_device), stream.stream());
    ASSERT_EQ(s, Status::kOk) << g.last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    EXPECT_EQ(g.health(), Status::kMismatch) << g.last_error();
    // "rank 0 call 2 all_reduce 4096 bfloat16, rank 1 call 2 all_gather 4096 bfloat16"
    const std::string other = kinds ? " all_gather 4096" : " all_reduce 8192";
    const std::string& e = g.last_error();
    EXPECT_NE(e.find("rank 0 call "), std::string::npos) << e;
    EXPECT_NE(e.find(" all_reduce 4096"), std::string::npos) << e;
    EXPECT_NE(e.find("rank 1 call "), std::string::npos) << e;
    EXPECT_NE(e.find(other), std::string::npos) << e;
    std::printf("rank %d: %s\n", rank, g.last_error().c_str());
    g_boot->barrier();
  }
}

}  // namespace
// Ranks that disagree on a call NCCL serves (above the custom kernels' limit): the check before
// NCCL (TPCOMM_NCCL_CHECK, on here; auto checks calls from 64 MiB) compares the calls over one
// barrier of the custom kernels, so every rank fails with kMismatch naming both calls, within
// the deadline, and NCCL, which would wait for a partner call or sum mismatched data, is
// aborted; the output of the call is poisoned. Needs a GPU per rank (NCCL refuses two ranks on
// one GPU).
TEST(MultiProcess, MismatchedCallsThatNcclServesFailEveryRank) {
  if (g_boot->world_size() != 2) GTEST_SKIP() << "two ranks";
  if (!g_gpu_per_rank) GTEST_SKIP() << "ranks share a GPU: NCCL refuses that";
  for (const bool kinds : {false, true}) {
    SCOPED_TRACE(kinds ? "all-reduce vs all-gather" : "1 MiB vs 2 MiB");
    Options o = mgpu_options("auto");
    o.timeout_ms = 3000;
    o.custom_ar_max_bytes = 64 << 10;
    o.nccl_check = Switch::kOn;
    Group g(*g_boot, g_device, o);
    StreamHolder stream;
    const std::int64_t most = std::int64_t{1} << 20;
    DeviceBuffer in(most * 2), out(most * 2);
    ASSERT_EQ(cudaMemset(in.get(), 0, most * 2), cudaSuccess);
    const int rank = g_boot->rank();
    const auto half = TensorView::flat(in.get(), DType::kBF16, most / 2, g_device);
    ASSERT_EQ(g.backend_for_all_reduce(half, half), "nccl");
    Status s;
    if (kinds && rank == 1)
      s = g.all_gather(TensorView::flat(in.get(), DType::kBF16, most / 2, g_device),
                       TensorView::flat(out.get(), DType::kBF16, most, g_device), stream.stream());
    else
      s = g.all_reduce(
          TensorView::flat(in.get(), DType::kBF16, rank == 0 ? most / 2 : most, g_device),
          TensorView::flat(out.get(), DType::kBF16, rank == 0 ? most / 2 : most, g_device),
          stream.stream());
    ASSERT_EQ(s, Status::kOk) << g.last_error();
    const auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    const Status health = g.health();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              o.timeout_ms / 1000.0 + 1.0);
    EXPECT_EQ(health, Status::kMismatch) << g.last_error();
    EXPECT_NE(g.last_error().find("rank 1 call 1 "), std::string::npos) << g.last_error();
    std::printf("rank %d: %s\n", rank, g.last_error().c_str());
    g_boot->barrier();
  }
}

}  // namespace tpcomm

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipping the mgpu tier\n");
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  tpcomm::Options o = tpcomm::Options::from_env();
  if (std::getenv("TPCOMM_TIMEOUT_MS") == nullptr)
    o.timeout_ms = 120000;  // time-sliced contexts are slow
  tpcomm::Bootstrap boot = tpcomm::Bootstrap::from_env(o);
  tpcomm::g_boot = &boot;
  tpcomm::g_gpu_per_rank = devices >= boot.local_world_size();
  tpcomm::g_device = boot.local_rank() % devices;
  cudaSetDevice(tpcomm::g_device);
  const int rc = RUN_ALL_TESTS();
  // Rank 0 hosts the store: nobody leaves while a peer may still use it (unless one died).
  if (std::getenv("TPCOMM_MGPU_DEAD_PEER") == nullptr && std::getenv("TPCOMM_MGPU_KILL") == nullptr)
    boot.barrier();
  return rc;
}
