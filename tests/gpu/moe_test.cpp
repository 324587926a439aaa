// SPDX-License-Identifier: Apache-2.0
// The end of a tensor-parallel MoE layer through Group (the combine, then the all-reduce +
// residual add + RMSNorm), with virtual ranks on one GPU, against a host reference in double
// precision: exact combined sums and residuals, the norm within the fused operation's
// tolerance, bitwise equality across ranks, repeated and never-chosen expert rows, zero weights,
// with and without the shared expert, graphs replayed with new inputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/moe.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::options_for;
using testing::run_ranks;
using testing::StreamHolder;

constexpr float kEps = 1e-5f;
constexpr std::int64_t kSpareRows = 3;  // expert rows no token chooses

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x ^ (x >> 29);
}

std::vector<unsigned char> encode(const std::vector<float>& values, DType dtype) {
  const std::size_t es = dtype_size(dtype);
  std::vector<unsigned char> out(values.size() * es);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kBF16) {
      const __nv_bfloat16 b = __float2bfloat16(values[i]);
      std::memcpy(out.data() + i * es, &b, 2);
    } else {
      std::memcpy(out.data() + i * es, &values[i], 4);
    }
  }
  return out;
}

double decode(const unsigned char* p, DType dtype) {
  if (dtype == DType::kBF16) {
    __nv_bfloat16 b;
    std::memcpy(&b, p, 2);
    return __bfloat162float(b);
  }
  float f = 0;
  std::memcpy(&f, p, 4);
  return f;
}

struct MoeCase {
  int world;
  std::int64_t tokens, hidden;
  int top_k;
  bool shared;
  DType dtype;
  [[nodiscard]] std::int64_t rows() const { return tokens * top_k + kSpareRows; }
  [[nodiscard]] std::string name() const {
    return detail::concat("world ", world, " tokens ", tokens, " hidden ", hidden, " top-", top_k,
                          shared ? " shared" : "", " ", to_string(dtype));
  }
};

/// Every rank's inputs (experts in {-1, 0, 1}, weights in {0, 0.5, 1}, shared in {-1, 0, 1}, so
/// that every sum is exact in bf16 at 8 ranks) and the expected outputs.
struct Inputs {
  std::vector<std::vector<float>> experts, weights, shared;  // per rank
  std::vector<std::int32_t> map;                             // the same on every rank
  std::vector<float> residual, gamma;
  std::vector<double> residual_out, norm;
};

Inputs make_inputs(const MoeCase& c, std::uint64_t seed) {
  Inputs in;
  const auto t_k = static_cast<std::size_t>(c.tokens * c.top_k);
  const auto n = static_cast<std::size_t>(c.tokens * c.hidden);
  // Rows repeat (a token may name one row twice) and the spare rows are never named.
  for (std::size_t i = 0; i < t_k; ++i)
    in.map.push_back(
        static_cast<std::int32_t>(mix(seed ^ (i * 977)) % static_cast<std::uint64_t>(t_k)));
  for (int r = 0; r < c.world; ++r) {
    const std::uint64_t rs = seed ^ (static_cast<std::uint64_t>(r + 1) << 48);
    std::vector<float> e(static_cast<std::size_t>(c.rows() * c.hidden)), w(t_k), s(n);
    for (std::size_t i = 0; i < e.size(); ++i)
      e[i] = static_cast<float>(static_cast<int>(mix(rs ^ i) % 3) - 1);
    for (std::size_t i = 0; i < t_k; ++i)
      w[i] = static_cast<float>(mix(rs ^ (i << 20) ^ 0x77) % 3) * 0.5f;
    for (std::size_t i = 0; i < n; ++i)
      s[i] = c.shared ? static_cast<float>(static_cast<int>(mix(rs ^ (i << 8) ^ 0x99) % 3) - 1) : 0;
    in.experts.push_back(std::move(e));
    in.weights.push_back(std::move(w));
    in.shared.push_back(std::move(s));
  }
  in.residual.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    in.residual[i] = static_cast<float>(static_cast<int>(mix(seed ^ 0x5e5e ^ (i << 4)) % 5) - 2);
  for (std::int64_t j = 0; j < c.hidden; ++j)
    in.gamma.push_back(
        static_cast<float>(mix(seed + static_cast<std::uint64_t>(j) * 31) % 64 + 32) / 64.0f);
  in.residual_out.assign(n, 0.0);
  in.norm.assign(n, 0.0);
  for (std::int64_t t = 0; t < c.tokens; ++t) {
    double squares = 0;
    for (std::int64_t h = 0; h < c.hidden; ++h) {
      const auto i = static_cast<std::size_t>(t * c.hidden + h);
      double v = in.residual[i];
      for (int r = 0; r < c.world; ++r) {
        const auto& rank = static_cast<std::size_t>(r);
        for (int k = 0; k < c.top_k; ++k) {
          const auto tk = static_cast<std::size_t>(t * c.top_k + k);
          v += static_cast<double>(in.weights[rank][tk]) *
               in.experts[rank][static_cast<std::size_t>(in.map[tk] * c.hidden + h)];
        }
        v += in.shared[rank][i];
      }
      in.residual_out[i] = v;
      squares += v * v;
    }
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(c.hidden) + kEps);
    for (std::int64_t h = 0; h < c.hidden; ++h) {
      const auto i = static_cast<std::size_t>(t * c.hidden + h);
      in.norm[i] = in.residual_out[i] * rstd * in.gamma[static_cast<std::size_t>(h)];
    }
  }
  return in;
}

/// Elements off the reference: the residual exactly, the norm within the fused operation's
/// tolerance (tests/gpu/add_rmsnorm_test.cpp).
std::int64_t off(const MoeCase& c, const Inputs& in, const std::vector<unsigned char>& residual_out,
                 const std::vector<unsigned char>& norm_out) {
  const std::size_t es = dtype_size(c.dtype);
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < in.norm.size(); ++i) {
    if (decode(residual_out.data() + i * es, c.dtype) != in.residual_out[i]) ++bad;
    const double tolerance =
        (c.dtype == DType::kBF16 ? 1.6e-2 : 1e-5) * std::abs(in.norm[i]) + 1e-3;
    if (!(std::abs(decode(norm_out.data() + i * es, c.dtype) - in.norm[i]) <= tolerance)) ++bad;
  }
  return bad;
}

TEST(Moe, FinalizeMatchesTheReferenceOnEveryRank) {
  constexpr std::int64_t kMaxTokens = 9, kMaxHidden = 7168;
  constexpr int kMaxTopK = 8;
  for (int world : {2, 3, 4, 8}) {
    std::vector<MoeCase> cases;
    for (DType dtype : {DType::kBF16, DType::kF32})
      for (int top_k : {1, 2, 8})
        for (bool shared : {false, true})
          for (std::int64_t tokens : {std::int64_t{1}, kMaxTokens})
            cases.push_back(
                {world, tokens, dtype == DType::kBF16 ? kMaxHidden : 1000, top_k, shared, dtype});
    // Each case eager, then replayed from a graph with new inputs: seeds the same on every rank.
    std::vector<std::uint64_t> seeds;
    for (std::size_t i = 0; i < cases.size() * 2; ++i) seeds.push_back(fresh_seed());
    std::mutex m;
    std::vector<std::vector<unsigned char>> first(seeds.size());  // rank 0's outputs per run
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      Group g(boot, 0, options_for("auto"));
      StreamHolder stream;
      const cudaStream_t cs = stream.get();
      const Stream s = stream.stream();
      const std::int64_t most = kMaxTokens * kMaxHidden * 4;
      DeviceBuffer experts((kMaxTokens * kMaxTopK + kSpareRows) * kMaxHidden * 4),
          map(kMaxTokens * kMaxTopK * 4), weights(kMaxTokens * kMaxTopK * 4), shared(most),
          residual(most), gamma(kMaxHidden * 4), norm_out(most), residual_out(most);
      for (std::size_t ci = 0; ci < cases.size(); ++ci) {
        const MoeCase& c = cases[ci];
        const DType wt = c.top_k == 2 ? DType::kF32 : c.dtype;  // f32 weights in some cases
        const auto flat = [&](DeviceBuffer& b, DType t, std::int64_t rows, std::int64_t cols) {
          return TensorView::contiguous(b.get(), t, {rows, cols}, 0);
        };
        const MoeCombine moe{flat(experts, c.dtype, c.rows(), c.hidden),
                             flat(map, DType::kI32, c.tokens, c.top_k),
                             flat(weights, wt, c.tokens, c.top_k),
                             c.shared ? flat(shared, c.dtype, c.tokens, c.hidden) : TensorView{}};
        const TensorView res = flat(residual, c.dtype, c.tokens, c.hidden);
        const TensorView gam = TensorView::flat(gamma.get(), c.dtype, c.hidden, 0);
        const TensorView nout = flat(norm_out, c.dtype, c.tokens, c.hidden);
        const TensorView rout = flat(residual_out, c.dtype, c.tokens, c.hidden);
        if (c.dtype == DType::kF32) {  // no fused kernel: the combine, then the fused call
          EXPECT_EQ(g.backend_for_moe_finalize(nout, nout).rfind("moe_combine+", 0), 0u)
              << c.name() << ": " << g.backend_for_moe_finalize(nout, nout);
        }
        for (int run = 0; run < 2; ++run) {
          const bool captured = run == 1;
          const std::size_t si = ci * 2 + static_cast<std::size_t>(run);
          const Inputs in = make_inputs(c, seeds[si]);
          const std::string what = c.name() + (captured ? " graph" : " eager");
          auto upload = [&](DeviceBuffer& b, const std::vector<unsigned char>& bytes) {
            ASSERT_EQ(
                cudaMemcpyAsync(b.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, cs),
                cudaSuccess);
          };
          const auto r = static_cast<std::size_t>(rank);
          std::optional<testing::CapturedGraph> graph;
          if (captured) {  // captured before the inputs are written: the replay reads new ones
            graph.emplace(g, s, [&] {
              EXPECT_EQ(g.moe_finalize_all_reduce_add_rmsnorm(moe, res, gam, kEps, nout, rout, s),
                        Status::kOk)
                  << what << ": " << g.last_error();
            });
            ASSERT_TRUE(graph->ok());
          }
          upload(experts, encode(in.experts[r], c.dtype));
          std::vector<unsigned char> map_bytes(in.map.size() * 4);
          std::memcpy(map_bytes.data(), in.map.data(), map_bytes.size());
          upload(map, map_bytes);
          upload(weights, encode(in.weights[r], wt));
          upload(shared, encode(in.shared[r], c.dtype));
          upload(residual, encode(in.residual, c.dtype));
          upload(gamma, encode(in.gamma, c.dtype));
          ASSERT_EQ(cudaMemsetAsync(norm_out.get(), 0xFF, most, cs), cudaSuccess);
          ASSERT_EQ(cudaMemsetAsync(residual_out.get(), 0xFF, most, cs), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
          boot.barrier();  // NOTE [graphs of virtual ranks]
          if (graph) {
            ASSERT_EQ(graph->launch(), cudaSuccess);
          } else {
            ASSERT_EQ(g.moe_finalize_all_reduce_add_rmsnorm(moe, res, gam, kEps, nout, rout, s),
                      Status::kOk)
                << what << ": " << g.last_error();
          }
          ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
          ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
          const std::size_t bytes = static_cast<std::size_t>(rout.nbytes());
          const auto got_residual = testing::to_host(residual_out.get(), bytes);
          const auto got_norm = testing::to_host(norm_out.get(), bytes);
          EXPECT_EQ(off(c, in, got_residual, got_norm), 0) << what << " rank " << rank;
          std::vector<unsigned char> both = got_residual;
          both.insert(both.end(), got_norm.begin(), got_norm.end());
          if (rank == 0) {
            std::lock_guard lock(m);
            first[si] = std::move(both);
          }
          boot.barrier();
          if (rank != 0) {
            EXPECT_TRUE(both == first[si]) << what << ": rank " << rank << " differs";
          }
          boot.barrier();
        }
      }
    });
  }
}

// With TPCOMM_MOE_PROLOGUE=1, where a Lamport kernel serves the fused norm, the combine is its
// prologue: bitwise what the combine kernel and then the fused call give, in both of its forms
// (whole packs of a row, and element by element where rows are not whole packs or the experts
// are not 16-byte aligned).
TEST(Moe, ThePrologueEqualsTheCombineThenTheFusedCall) {
  constexpr std::int64_t kMaxTokens = 3, kMaxHidden = 7168;
  constexpr int kMaxTopK = 8;
  for (int world : {2, 3, 8}) {
    std::vector<MoeCase> cases;
    for (std::int64_t hidden : {kMaxHidden, std::int64_t{1001}})
      for (int top_k : {1, 8})
        for (bool shared : {false, true})
          for (std::int64_t tokens : {std::int64_t{1}, kMaxTokens})
            cases.push_back({world, tokens, hidden, top_k, shared, DType::kBF16});
    std::vector<std::uint64_t> seeds;
    for (std::size_t i = 0; i < cases.size() * 2; ++i) seeds.push_back(fresh_seed());
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      Options o = options_for("auto");
      o.moe_prologue = Switch::kOn;  // the built-in choice launches the combine first
      Group g(boot, 0, o);
      StreamHolder stream;
      const cudaStream_t cs = stream.get();
      const Stream s = stream.stream();
      const std::int64_t most = kMaxTokens * kMaxHidden * 2;
      DeviceBuffer experts((kMaxTokens * kMaxTopK + kSpareRows) * kMaxHidden * 2 + 16),
          map(kMaxTokens * kMaxTopK * 4), weights(kMaxTokens * kMaxTopK * 4), shared(most),
          residual(most), gamma(kMaxHidden * 2), x(most), norm_a(most), residual_a(most),
          norm_b(most), residual_b(most);
      for (std::size_t si = 0; si < seeds.size(); ++si) {
        const MoeCase& c = cases[si / 2];
        const bool aligned = si % 2 == 0;  // the experts 2 bytes off 16-byte alignment otherwise
        const Inputs in = make_inputs(c, seeds[si]);
        const auto r = static_cast<std::size_t>(rank);
        const std::string what = c.name() + (aligned ? "" : " misaligned experts");
        auto at = [&](void* p, DType t, std::int64_t rows, std::int64_t cols) {
          return TensorView::contiguous(p, t, {rows, cols}, 0);
        };
        char* e = static_cast<char*>(experts.get()) + (aligned ? 0 : 2);
        const MoeCombine moe{
            at(e, c.dtype, c.rows(), c.hidden), at(map.get(), DType::kI32, c.tokens, c.top_k),
            at(weights.get(), DType::kF32, c.tokens, c.top_k),
            c.shared ? at(shared.get(), c.dtype, c.tokens, c.hidden) : TensorView{}};
        const TensorView res = at(residual.get(), c.dtype, c.tokens, c.hidden);
        const TensorView gam = TensorView::flat(gamma.get(), c.dtype, c.hidden, 0);
        const TensorView xv = at(x.get(), c.dtype, c.tokens, c.hidden);
        ASSERT_EQ(g.backend_for_moe_finalize(xv, xv).rfind("custom_ar:lamport", 0), 0u)
            << what << ": not a case of the prologue: " << g.backend_for_moe_finalize(xv, xv);
        auto upload = [&](void* p, const std::vector<unsigned char>& bytes) {
          ASSERT_EQ(cudaMemcpyAsync(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, cs),
                    cudaSuccess);
        };
        upload(e, encode(in.experts[r], c.dtype));
        std::vector<unsigned char> map_bytes(in.map.size() * 4);
        std::memcpy(map_bytes.data(), in.map.data(), map_bytes.size());
        upload(map.get(), map_bytes);
        upload(weights.get(), encode(in.weights[r], DType::kF32));
        upload(shared.get(), encode(in.shared[r], c.dtype));
        upload(residual.get(), encode(in.residual, c.dtype));
        upload(gamma.get(), encode(in.gamma, c.dtype));
        for (DeviceBuffer* out : {&norm_a, &residual_a, &norm_b, &residual_b})
          ASSERT_EQ(cudaMemsetAsync(out->get(), 0xFF, most, cs), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
        const TensorView na = at(norm_a.get(), c.dtype, c.tokens, c.hidden);
        const TensorView ra = at(residual_a.get(), c.dtype, c.tokens, c.hidden);
        const TensorView nb = at(norm_b.get(), c.dtype, c.tokens, c.hidden);
        const TensorView rb = at(residual_b.get(), c.dtype, c.tokens, c.hidden);
        ASSERT_EQ(g.moe_finalize_all_reduce_add_rmsnorm(moe, res, gam, kEps, na, ra, s),
                  Status::kOk)
            << what << ": " << g.last_error();
        ASSERT_EQ(moe_combine(moe, xv, s), Status::kOk) << what;
        ASSERT_EQ(g.all_reduce_add_rmsnorm(xv, res, gam, kEps, nb, rb, s), Status::kOk)
            << what << ": " << g.last_error();
        ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
        ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
        const auto bytes = static_cast<std::size_t>(ra.nbytes());
        const auto got_residual = testing::to_host(residual_a.get(), bytes);
        const auto got_norm = testing::to_host(norm_a.get(), bytes);
        EXPECT_EQ(got_residual, testing::to_host(residual_b.get(), bytes))
            << what << " rank " << rank;
        EXPECT_EQ(got_norm, testing::to_host(norm_b.get(), bytes)) << what << " rank " << rank;
        EXPECT_EQ(off(c, in, got_residual, got_norm), 0) << what << " rank " << rank;
        boot.barrier();
      }
    });
  }
}

// What the combine cannot serve is refused before anything runs, naming the argument.
TEST(Moe, BadArgumentsAreRefusedAndLoseNothing) {
  run_ranks(2, [&](int, Bootstrap& boot) {
    Group g(boot, 0, options_for("auto"));
    StreamHolder stream;
    DeviceBuffer a(1 << 16), b(1 << 16), c(1 << 16), d(1 << 16);
    const auto experts = TensorView::contiguous(a.get(), DType::kBF16, {4, 64}, 0);
    const auto map = TensorView::contiguous(b.get(), DType::kI64, {2, 2}, 0);
    const auto weights = TensorView::contiguous(b.get(), DType::kF32, {2, 2}, 0);
    const auto out = TensorView::contiguous(c.get(), DType::kBF16, {2, 64}, 0);
    const auto gamma = TensorView::flat(d.get(), DType::kBF16, 64, 0);
    EXPECT_EQ(g.moe_finalize_all_reduce_add_rmsnorm({experts, map, weights, {}}, {}, gamma, kEps,
                                                    out, out, stream.stream()),
              Status::kInvalidArgument);
    EXPECT_NE(g.last_error().find("map must be int32"), std::string::npos) << g.last_error();
    EXPECT_EQ(g.health(), Status::kOk);
  });
}

}  // namespace
}  // namespace tpcomm
