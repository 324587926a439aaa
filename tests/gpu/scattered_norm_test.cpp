// SPDX-License-Identifier: Apache-2.0
// `Group::reduce_scatter_add_rmsnorm` (the sequence-parallel fused norm) on virtual ranks: each
// rank's rows bitwise what the all-reduce followed by the local `add_rmsnorm` of those rows
// gives, its residual_out the exact integer sum; eager and graph-replayed with fresh inputs;
// every output poisoned first; bad shapes refused before anything runs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "kernels/kernels.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/norm.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::run_ranks;
using testing::StreamHolder;
using testing::to_host;

constexpr float kEps = 1e-6f;

struct Case {
  int world;
  std::int64_t tokens;
  std::int64_t hidden;
  DType norm_dtype = DType::kBF16;  // or kF8E4M3, with per-row scales
  bool in_place = false;            // residual_out is the residual
  [[nodiscard]] std::string name() const {
    return detail::concat("world ", world, " tokens ", tokens, " hidden ", hidden, " -> ",
                          to_string(norm_dtype), in_place ? " in place" : "");
  }
};

/// Integer-valued bf16 values from `seed`: every sum of them is exact.
std::vector<__nv_bfloat16> integers(std::int64_t n, std::uint64_t seed, int spread) {
  std::mt19937_64 rng(seed);
  std::vector<__nv_bfloat16> v(static_cast<std::size_t>(n));
  for (auto& e : v)
    e = __float2bfloat16(static_cast<float>(static_cast<int>(rng() % (2 * spread + 1)) - spread));
  return v;
}

void upload(void* dst, const std::vector<__nv_bfloat16>& src, cudaStream_t s) {
  ASSERT_EQ(cudaMemcpyAsync(dst, src.data(), src.size() * 2, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}

/// One rank's buffers for `c`: the full x and sum, its rows' residual, gamma and outputs (the
/// call's and the reference's), and the FP8 row scales.
struct Buffers {
  explicit Buffers(const Case& c)
      : x(bytes(c.tokens * c.hidden)),
        sum(bytes(c.tokens * c.hidden)),
        residual(bytes(rows(c) * c.hidden)),
        reference_residual(bytes(rows(c) * c.hidden)),
        gamma(bytes(c.hidden)),
        norm_out(bytes(rows(c) * c.hidden)),
        residual_out(bytes(rows(c) * c.hidden)),
        reference_norm(bytes(rows(c) * c.hidden)),
        reference_out(bytes(rows(c) * c.hidden)),
        scales(static_cast<std::size_t>(rows(c)) * 4 + 64),
        reference_scales(static_cast<std::size_t>(rows(c)) * 4 + 64) {}
  static std::int64_t rows(const Case& c) { return c.tokens / c.world; }
  static std::size_t bytes(std::int64_t n) { return static_cast<std::size_t>(n) * 2 + 64; }
  DeviceBuffer x, sum, residual, reference_residual, gamma, norm_out, residual_out, reference_norm,
      reference_out, scales, reference_scales;
};

/// Uploads fresh inputs for `rank` (x its own, the residual its rows of one shared residual) and
/// poisons every output.
void fresh_inputs(const Case& c, int rank, std::uint64_t seed, Buffers& b, cudaStream_t s) {
  const std::int64_t rows = Buffers::rows(c);
  upload(b.x.get(), integers(c.tokens * c.hidden, seed ^ (0x9e37ull * (rank + 1)), 4), s);
  const auto residual = integers(c.tokens * c.hidden, seed ^ 0x5e5eull, 8);
  const std::vector<__nv_bfloat16> mine(residual.begin() + rank * rows * c.hidden,
                                        residual.begin() + (rank + 1) * rows * c.hidden);
  upload(b.residual.get(), mine, s);
  upload(b.reference_residual.get(), mine, s);
  std::vector<__nv_bfloat16> gamma(static_cast<std::size_t>(c.hidden));
  for (std::size_t j = 0; j < gamma.size(); ++j)
    gamma[j] = __float2bfloat16(static_cast<float>(j % 64 + 32) / 64.0f);
  upload(b.gamma.get(), gamma, s);
  for (DeviceBuffer* p : {&b.norm_out, &b.residual_out, &b.scales, &b.reference_norm,
                          &b.reference_out, &b.reference_scales})
    ASSERT_EQ(kernels::poison(p->get(), static_cast<std::int64_t>(p->size()),
                              reinterpret_cast<Stream>(s)),
              Status::kOk);
}

TensorView rows_of(void* p, DType t, std::int64_t rows, std::int64_t hidden) {
  return TensorView::contiguous(p, t, {rows, hidden}, 0);
}

/// The call under test on `b` (in place: residual_out is the residual).
Status scattered(Group& g, const Case& c, Buffers& b, Stream s) {
  const std::int64_t rows = Buffers::rows(c);
  const TensorView residual = rows_of(b.residual.get(), DType::kBF16, rows, c.hidden);
  Fp8Scales fp8;
  if (c.norm_dtype == DType::kF8E4M3)
    fp8.row_scales = TensorView::flat(b.scales.get(), DType::kF32, rows, 0);
  return g.reduce_scatter_add_rmsnorm(
      rows_of(b.x.get(), DType::kBF16, c.tokens, c.hidden), residual,
      TensorView::flat(b.gamma.get(), DType::kBF16, c.hidden, 0), kEps,
      rows_of(b.norm_out.get(), c.norm_dtype, rows, c.hidden),
      c.in_place ? residual : rows_of(b.residual_out.get(), DType::kBF16, rows, c.hidden), s, fp8);
}

/// The reference: the all-reduce of x, then the local add + RMSNorm of this rank's rows of it.
Status reference(Group& g, const Case& c, int rank, Buffers& b, Stream s) {
  const std::int64_t rows = Buffers::rows(c);
  const std::int64_t n = c.tokens * c.hidden;
  TPCOMM_TRY(g.all_reduce(TensorView::flat(b.x.get(), DType::kBF16, n, 0),
                          TensorView::flat(b.sum.get(), DType::kBF16, n, 0), s));
  Fp8Scales fp8;
  if (c.norm_dtype == DType::kF8E4M3)
    fp8.row_scales = TensorView::flat(b.reference_scales.get(), DType::kF32, rows, 0);
  return add_rmsnorm(
      rows_of(b.sum.bytes_ptr() + rank * rows * c.hidden * 2, DType::kBF16, rows, c.hidden),
      rows_of(b.reference_residual.get(), DType::kBF16, rows, c.hidden),
      TensorView::flat(b.gamma.get(), DType::kBF16, c.hidden, 0), kEps,
      rows_of(b.reference_norm.get(), c.norm_dtype, rows, c.hidden),
      rows_of(b.reference_out.get(), DType::kBF16, rows, c.hidden), s, fp8);
}

/// This rank's outputs against the reference's, bitwise.
void expect_same(const Case& c, int rank, const Buffers& b, const char* how) {
  const std::int64_t rows = Buffers::rows(c);
  const auto n = static_cast<std::size_t>(rows * c.hidden);
  const void* residual_out = c.in_place ? b.residual.get() : b.residual_out.get();
  EXPECT_EQ(to_host(residual_out, n * 2), to_host(b.reference_out.get(), n * 2))
      << c.name() << " rank " << rank << " " << how << ": residual_out";
  EXPECT_EQ(to_host(b.norm_out.get(), n * dtype_size(c.norm_dtype)),
            to_host(b.reference_norm.get(), n * dtype_size(c.norm_dtype)))
      << c.name() << " rank " << rank << " " << how << ": norm_out";
  if (c.norm_dtype == DType::kF8E4M3) {
    EXPECT_EQ(to_host(b.scales.get(), static_cast<std::size_t>(rows) * 4),
              to_host(b.reference_scales.get(), static_cast<std::size_t>(rows) * 4))
        << c.name() << " rank " << rank << " " << how << ": row scales";
  }
}

/// `c` on the path `algo` gives: "auto" the custom kernel whose ranks finish their own rows
/// (NOTE [scattered rows]), "lamport" (a kernel that keeps every rank's sum) the fallback.
void run_case(const Case& c, const std::string& algo = "auto") {
  SCOPED_TRACE(c.name() + " " + algo);
  const std::uint64_t seed = testing::fresh_seed();
  run_ranks(c.world, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, testing::options_for(algo, 32 << 20));
    StreamHolder stream;
    const Stream s = stream.stream();
    Buffers b(c);
    const std::string path = g.backend_for_reduce_scatter_add_rmsnorm(
        rows_of(b.x.get(), DType::kBF16, c.tokens, c.hidden),
        rows_of(b.norm_out.get(), c.norm_dtype, Buffers::rows(c), c.hidden));
    // The kernel where each rank's rows start on a pack and x is within the fused bound.
    if (algo == "auto" && Buffers::rows(c) * c.hidden * 2 % 16 == 0 &&
        c.tokens * c.hidden * 2 <= info(Algo::kLamportTwoShot).fused.bound(c.world))
      EXPECT_EQ(path, "custom_ar:lamport_two_shot");
    else
      EXPECT_NE(path.find("+add_rmsnorm"), std::string::npos) << path;
    // Eager.
    fresh_inputs(c, rank, seed, b, stream.get());
    ASSERT_EQ(reference(g, c, rank, b, s), Status::kOk) << g.last_error();
    ASSERT_EQ(scattered(g, c, b, s), Status::kOk) << g.last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    expect_same(c, rank, b, "eager");
    // Graph-replayed, twice, with fresh inputs before each replay.
    boot.barrier();
    testing::CapturedGraph graph(g, s, [&] { ASSERT_EQ(scattered(g, c, b, s), Status::kOk); });
    ASSERT_TRUE(graph.ok());
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    boot.barrier();
    for (int replay = 0; replay < 2; ++replay) {
      fresh_inputs(c, rank, seed + 1 + replay, b, stream.get());
      ASSERT_EQ(reference(g, c, rank, b, s), Status::kOk) << g.last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      // The reference wrote into the residual's twin; the graph reads the residual itself.
      boot.barrier();
      ASSERT_EQ(graph.launch(), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
      expect_same(c, rank, b, "replayed");
      boot.barrier();
    }
  });
}

TEST(ReduceScatterAddRmsNorm, EachRankHasItsRowsOfTheUnscatteredResult) {
  for (int world : {2, 4, 8})
    for (std::int64_t rows : {1, 4, 16})
      for (std::int64_t hidden : {4096, 7168})
        for (const char* algo : {"auto", "lamport"}) run_case({world, rows * world, hidden}, algo);
}

// A hidden size whose rows do not start on packs, and one whose slices do not either: the custom
// kernel where its slices start on packs (its rows need not), the fallback where they do not.
TEST(ReduceScatterAddRmsNorm, RowsOffPackBoundaries) {
  run_case({2, 16, 2884});  // a slice of 8 rows of 2884 elements starts on a pack
  run_case({4, 4, 2884});   // one row a rank: 2884 * 2 bytes is not a multiple of 16
}

// In a deterministic group the sum is the all-reduce of every row (batch-invariant), and each
// rank's rows are bitwise those of `all_reduce_add_rmsnorm` in the same group, whose fused
// kernels launch the local norm's shape (docs/DETERMINISM.md).
TEST(ReduceScatterAddRmsNorm, DeterministicGroupsGiveTheFusedCallsRows) {
  for (int world : {2, 4, 8}) {
    for (std::int64_t hidden : {4096, 7168}) {
      const Case c{world, 4 * world, hidden};
      SCOPED_TRACE(c.name());
      const std::uint64_t seed = testing::fresh_seed();
      run_ranks(world, [&](int rank, Bootstrap& boot) {
        Options o = testing::options_for("auto", 32 << 20);
        o.deterministic = Determinism::kStrict;
        Group g(boot, 0, o);
        StreamHolder stream;
        const Stream s = stream.stream();
        Buffers b(c);
        fresh_inputs(c, rank, seed, b, stream.get());
        ASSERT_EQ(scattered(g, c, b, s), Status::kOk) << g.last_error();
        // The fused call over every row, with every rank's residual rows in place.
        const std::int64_t rows = Buffers::rows(c);
        const std::int64_t n = c.tokens * c.hidden;
        DeviceBuffer residual(static_cast<std::size_t>(n) * 2),
            norm(static_cast<std::size_t>(n) * 2), out(static_cast<std::size_t>(n) * 2);
        upload(residual.get(), integers(n, seed ^ 0x5e5eull, 8), stream.get());
        ASSERT_EQ(
            g.all_reduce_add_rmsnorm(rows_of(b.x.get(), DType::kBF16, c.tokens, c.hidden),
                                     rows_of(residual.get(), DType::kBF16, c.tokens, c.hidden),
                                     TensorView::flat(b.gamma.get(), DType::kBF16, c.hidden, 0),
                                     kEps, rows_of(norm.get(), DType::kBF16, c.tokens, c.hidden),
                                     rows_of(out.get(), DType::kBF16, c.tokens, c.hidden), s),
            Status::kOk)
            << g.last_error();
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
        const auto bytes = static_cast<std::size_t>(rows * c.hidden) * 2;
        const auto offset = static_cast<std::size_t>(rank) * bytes;
        EXPECT_EQ(to_host(b.norm_out.get(), bytes), to_host(norm.bytes_ptr() + offset, bytes))
            << "rank " << rank << ": norm_out";
        EXPECT_EQ(to_host(b.residual_out.get(), bytes), to_host(out.bytes_ptr() + offset, bytes))
            << "rank " << rank << ": residual_out";
        boot.barrier();
      });
    }
  }
}

TEST(ReduceScatterAddRmsNorm, Fp8RowScalesAndInPlace) {
  for (const char* algo : {"auto", "lamport"}) {
    run_case({4, 16, 4096, DType::kF8E4M3}, algo);
    run_case({4, 16, 4096, DType::kF8E4M3, /*in_place=*/true}, algo);
    run_case({2, 8, 7168, DType::kBF16, /*in_place=*/true}, algo);
  }
}

// Shapes the call cannot take are refused on every rank before anything runs; the outputs are
// left as they were.
TEST(ReduceScatterAddRmsNorm, BadShapesAreClearErrors) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, testing::options_for("auto"));
    StreamHolder stream;
    const Stream s = stream.stream();
    const Case c{2, 4, 256};
    Buffers b(c);
    fresh_inputs(c, rank, 1, b, stream.get());
    const auto before = to_host(b.norm_out.get(), 2 * 256 * 2);
    const TensorView gamma = TensorView::flat(b.gamma.get(), DType::kBF16, 256, 0);
    const TensorView out2 = rows_of(b.norm_out.get(), DType::kBF16, 2, 256);
    const TensorView res2 = rows_of(b.residual_out.get(), DType::kBF16, 2, 256);
    const TensorView residual2 = rows_of(b.residual.get(), DType::kBF16, 2, 256);
    // 3 tokens over 2 ranks.
    EXPECT_EQ(g.reduce_scatter_add_rmsnorm(rows_of(b.x.get(), DType::kBF16, 3, 256), residual2,
                                           gamma, kEps, out2, res2, s),
              Status::kInvalidArgument);
    EXPECT_NE(g.last_error().find("do not split evenly"), std::string::npos) << g.last_error();
    // Outputs of every token instead of this rank's.
    const TensorView x4 = rows_of(b.x.get(), DType::kBF16, 4, 256);
    EXPECT_EQ(
        g.reduce_scatter_add_rmsnorm(x4, rows_of(b.residual.get(), DType::kBF16, 4, 256), gamma,
                                     kEps, rows_of(b.norm_out.get(), DType::kBF16, 4, 256),
                                     rows_of(b.residual_out.get(), DType::kBF16, 4, 256), s),
        Status::kInvalidArgument);
    // An output inside x.
    EXPECT_EQ(g.reduce_scatter_add_rmsnorm(x4, residual2, gamma, kEps,
                                           rows_of(b.x.get(), DType::kBF16, 2, 256), res2, s),
              Status::kInvalidArgument);
    EXPECT_NE(g.last_error().find("overlaps x"), std::string::npos) << g.last_error();
    // x of one dimension.
    EXPECT_EQ(g.reduce_scatter_add_rmsnorm(TensorView::flat(b.x.get(), DType::kBF16, 1024, 0),
                                           residual2, gamma, kEps, out2, res2, s),
              Status::kInvalidArgument);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    EXPECT_EQ(to_host(b.norm_out.get(), 2 * 256 * 2), before);
    // The group is still usable: a good call after the refused ones.
    EXPECT_EQ(g.reduce_scatter_add_rmsnorm(x4, residual2, gamma, kEps, out2, res2, s), Status::kOk)
        << g.last_error();
    EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    boot.barrier();
  });
}

}  // namespace
}  // namespace tpcomm
