// SPDX-License-Identifier: Apache-2.0
// Batch invariance of the fused all-reduce + residual add + RMSNorm and of the MoE finalize
// (docs/DETERMINISM.md) on deterministic groups of virtual ranks (`GroupConfig::deterministic`,
// whose fused launch shape does not follow the batch: NOTE [batch invariance] in
// tune/selector.hpp). Token rows as in determinism_test.cpp: `residual_out` equals the host's
// sum, rounded once, plus the residual in fp32, rounded once more; `norm_out` in each form of the
// norm, its FP8 scales and the MoE finalize's outputs equal their first sighting, bitwise,
// whatever the batch, the position, the algorithm, eager or replayed, on every rank.
#include <gtest/gtest.h>

#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "support/batch_rows.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm {
namespace {

using testing::algorithms;
using testing::batches_for;
using testing::Bytes;
using testing::deterministic;
using testing::DeviceBuffer;
using testing::invariance_options;
using testing::kFewBatches;
using testing::kMaxBatch;
using testing::kMaxBytes;
using testing::kMaxHidden;
using testing::kPlacements;
using testing::kTokens;
using testing::mix;
using testing::position;
using testing::run_ranks;
using testing::Seen;
using testing::StreamHolder;
using testing::Sweep;
using testing::to_bits;
using testing::Tokens;
using testing::wide;

constexpr float kEps = 1e-6f;

/// The forms of the fused norm reachable through `all_reduce_add_rmsnorm`.
enum class Fp8 { kNone, kTensor, kRow, kGroup };
struct Form {
  const char* name;
  bool residual = true;
  bool gamma_f32 = false;
  bool plus_one = false;
  Fp8 fp8 = Fp8::kNone;
};
const Form kForms[] = {
    {"gamma"},
    {"f32 gamma", true, true},
    {"1 + gamma", true, false, true},
    {"no residual", false},
    {"fp8 per tensor", true, false, false, Fp8::kTensor},
    {"fp8 per row", true, false, false, Fp8::kRow},
    {"fp8 per group", true, false, false, Fp8::kGroup},
};

struct FusedCase {
  Tokens tokens;
  Form form;
  std::span<const std::int64_t> batches;

  [[nodiscard]] DType norm_dtype() const {
    return form.fp8 == Fp8::kNone ? tokens.dtype : DType::kF8E4M3;
  }
  [[nodiscard]] std::int64_t groups() const { return tokens.hidden / kernels::kFp8Group; }
  [[nodiscard]] std::string name() const { return tokens.name() + ", " + form.name; }
};

/// Each world size: the plain form at every hidden size, f16 at one, and on 2 and 8 ranks every
/// other form at 7168 (a multiple of the FP8 group).
std::vector<FusedCase> fused_cases(int world) {
  std::vector<FusedCase> out;
  const std::span<const std::int64_t> few(kFewBatches);
  for (std::int64_t hidden : wide(world) ? std::vector<std::int64_t>{2880, 4096, 7168, 8192}
                                         : std::vector<std::int64_t>{2880, 8192})
    out.push_back({Tokens(world, hidden, DType::kBF16), kForms[0], batches_for(world)});
  out.push_back({Tokens(world, wide(world) ? 4096 : 2880, DType::kF16), kForms[0], few});
  if (wide(world))
    for (std::size_t f = 1; f < std::size(kForms); ++f)
      out.push_back({Tokens(world, 7168, DType::kBF16), kForms[f], few});
  return out;
}

/// Gamma of `hidden` elements near 1 (near 0 for `1 + gamma`), in the case's dtype or f32 (with
/// bits the 16-bit types do not hold).
Bytes gamma_of(const FusedCase& c) {
  Bytes out;
  for (std::int64_t j = 0; j < c.tokens.hidden; ++j) {
    float g = 0.5f + static_cast<float>(mix(static_cast<std::uint64_t>(j) + 7) % 1000) / 1000.f;
    if (c.form.plus_one) g -= 1.f;
    if (c.form.gamma_f32) {
      g += 1.f / 8192;
      const auto* p = reinterpret_cast<const unsigned char*>(&g);
      out.insert(out.end(), p, p + 4);
    } else {
      const std::uint16_t bits = to_bits(g, c.tokens.dtype);
      const auto* p = reinterpret_cast<const unsigned char*>(&bits);
      out.insert(out.end(), p, p + 2);
    }
  }
  return out;
}

/// One rank's buffers for the fused calls, and the call of a case over them.
struct FusedRank {
  DeviceBuffer x{kMaxBytes}, residual{kMaxBytes}, norm_out{kMaxBytes}, residual_out{kMaxBytes},
      gamma{kMaxHidden * 4}, scale{64}, scales{kMaxBatch * (kMaxHidden / kernels::kFp8Group) * 4};

  static TensorView view(const DeviceBuffer& b, DType t, const FusedCase& c, std::int64_t rows) {
    return TensorView::contiguous(b.get(), t, {rows, c.tokens.hidden}, 0);
  }
  Status call(Group& g, const FusedCase& c, std::int64_t rows, Stream s) {
    const DType t = c.tokens.dtype;
    Fp8Scales fp8;
    if (c.form.fp8 == Fp8::kTensor) fp8.scale = TensorView::flat(scale.get(), DType::kF32, 1, 0);
    if (c.form.fp8 == Fp8::kRow)
      fp8.row_scales = TensorView::flat(scales.get(), DType::kF32, rows, 0);
    if (c.form.fp8 == Fp8::kGroup)
      fp8.group_scales = TensorView::contiguous(scales.get(), DType::kF32, {rows, c.groups()}, 0);
    return g.all_reduce_add_rmsnorm(
        view(x, t, c, rows), c.form.residual ? view(residual, t, c, rows) : TensorView{},
        TensorView::flat(gamma.get(), c.form.gamma_f32 ? DType::kF32 : t, c.tokens.hidden, 0), kEps,
        view(norm_out, c.norm_dtype(), c, rows), view(residual_out, t, c, rows), s, fp8,
        c.form.plus_one ? NormWeight::kOnePlusGamma : NormWeight::kGamma);
  }
  /// Gamma and the per-tensor scale of `c`, once per case.
  void prepare(const Bytes& gamma_bytes, const StreamHolder& s) {
    static const float kScale = 1.f / 64;
    ASSERT_EQ(cudaMemcpyAsync(gamma.get(), gamma_bytes.data(), gamma_bytes.size(),
                              cudaMemcpyHostToDevice, s.get()),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(scale.get(), &kScale, 4, cudaMemcpyHostToDevice, s.get()),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s.get()), cudaSuccess);
  }
  /// The filler of a batch and the token rows of placement `p`; outputs poisoned.
  void write(const FusedCase& c, std::int64_t rows, int p, int rank, const StreamHolder& s) {
    const Tokens& t = c.tokens;
    const auto seed = static_cast<std::uint64_t>(rows * 4 + p);
    testing::fill(s, x, t.dtype, rows * t.hidden, seed, rank);
    testing::fill(s, residual, t.dtype, rows * t.hidden, seed + 1000, 0);  // the same on every rank
    for (DeviceBuffer* b : {&norm_out, &residual_out, &scales})
      ASSERT_EQ(kernels::poison(b->get(), static_cast<std::int64_t>(b->size()), s.stream()),
                Status::kOk);
    for (int k = 0; k < kTokens; ++k) {
      if (const std::int64_t at = position(k, p, rows); at >= 0) {
        testing::put_row(s, x, at, t.input(k, rank));
        testing::put_row(s, residual, at, t.residual[static_cast<std::size_t>(k)]);
      }
    }
  }
  /// Token rows of placement `p`: `residual_out` against the host, the rest against the first
  /// sighting.
  void check(const FusedCase& c, std::int64_t rows, int p, const std::string& what, Seen& seen) {
    const Tokens& t = c.tokens;
    const std::size_t norm_row = static_cast<std::size_t>(t.hidden) * dtype_size(c.norm_dtype());
    for (int k = 0; k < kTokens; ++k) {
      const std::int64_t at = position(k, p, rows);
      if (at < 0) continue;
      const std::string at_what = detail::concat(what, ", token ", k, " at row ", at, " of ", rows);
      const auto kk = static_cast<std::size_t>(k);
      seen.expect_equal(c.form.residual ? t.sum_residual[kk] : t.sum[kk],
                        testing::read(residual_out.bytes_ptr() + at * t.hidden * 2, t.row_bytes()),
                        "residual_out of " + at_what);
      const std::string key = detail::concat(c.name(), ", token ", k);
      seen.expect_same(key + " norm_out",
                       testing::read(norm_out.bytes_ptr() + at * norm_row, norm_row),
                       "norm_out of " + at_what);
      if (c.form.fp8 == Fp8::kRow)
        seen.expect_same(key + " scale", testing::read(scales.bytes_ptr() + at * 4, 4),
                         "row scale of " + at_what);
      if (c.form.fp8 == Fp8::kGroup) {
        const auto bytes = static_cast<std::size_t>(c.groups()) * 4;
        seen.expect_same(key + " scales",
                         testing::read(scales.bytes_ptr() + at * c.groups() * 4, bytes),
                         "group scales of " + at_what);
      }
    }
  }
};

class FusedInvariance : public ::testing::TestWithParam<int> {};

TEST_P(FusedInvariance, FusedNormRowsAreBitwiseTheSameInEveryBatch) {
  const int world = GetParam();
  const std::vector<FusedCase> cases = fused_cases(world);
  std::vector<Bytes> gammas;
  for (const FusedCase& c : cases) gammas.push_back(gamma_of(c));
  Seen seen;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    StreamHolder stream;
    FusedRank b;
    for (const std::string& algo : algorithms(true)) {
      Group g(boot, 0, invariance_options(algo), deterministic());
      for (std::size_t i = 0; i < cases.size(); ++i) {
        const FusedCase& c = cases[i];
        b.prepare(gammas[i], stream);
        const Sweep sweep{
            g,
            boot,
            stream,
            [&](std::int64_t rows) { return b.call(g, c, rows, stream.stream()); },
            [&](std::int64_t rows, int p) { b.write(c, rows, p, rank, stream); },
            [&](std::int64_t rows, int p, const char* mode) {
              const TensorView v = b.view(b.x, c.tokens.dtype, c, rows);
              const TensorView nv = b.view(b.norm_out, c.norm_dtype(), c, rows);
              b.check(c, rows, p,
                      detail::concat(c.name(), ", ", algo, " (", g.backend_for_add_rmsnorm(v, nv),
                                     "), ", mode, ", rank ", rank),
                      seen);
            }};
        sweep.run(c.batches);
      }
      boot.barrier();
    }
  });
  EXPECT_EQ(seen.differences(), 0);
}

// The MoE finalize: each rank's two expert rows and shared row of a token, combined, reduced and
// normalised, bitwise the same in every batch (the combine a prologue of the fused kernel where
// it fits, a kernel of its own beyond).
TEST_P(FusedInvariance, MoeFinalizeRowsAreBitwiseTheSameInEveryBatch) {
  const int world = GetParam();
  constexpr std::int64_t kHidden = 4096;
  constexpr std::int64_t kTopK = 2;
  const DType t = DType::kBF16;
  const Tokens e0(world, kHidden, t, 1), e1(world, kHidden, t, 2), shared(world, kHidden, t, 3);
  FusedCase c{Tokens(world, kHidden, t), kForms[0], std::span<const std::int64_t>(kFewBatches)};
  const Bytes gamma = gamma_of(c);
  Seen seen;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    StreamHolder stream;
    const Stream s = stream.stream();
    FusedRank b;
    DeviceBuffer experts(kMaxBatch * kTopK * kHidden * 2), map(kMaxBatch * kTopK * 4),
        weights(kMaxBatch * kTopK * 2), shared_rows(kMaxBatch * kHidden * 2);
    for (const std::string& algo : algorithms(true)) {
      Group g(boot, 0, invariance_options(algo), deterministic());
      b.prepare(gamma, stream);
      auto moe = [&](std::int64_t rows) {
        return MoeCombine{TensorView::contiguous(experts.get(), t, {rows * kTopK, kHidden}, 0),
                          TensorView::contiguous(map.get(), DType::kI32, {rows, kTopK}, 0),
                          TensorView::contiguous(weights.get(), t, {rows, kTopK}, 0),
                          TensorView::contiguous(shared_rows.get(), t, {rows, kHidden}, 0)};
      };
      std::vector<std::int32_t> map_host;
      // Token k's router weights on this rank (not powers of two: the products round).
      std::vector<std::vector<std::uint16_t>> router;
      for (int k = 0; k < kTokens; ++k)
        router.push_back({to_bits(0.3f + 0.1f * static_cast<float>(k + rank), t),
                          to_bits(0.7f - 0.05f * static_cast<float>(k), t)});
      const Sweep sweep{
          g,
          boot,
          stream,
          [&](std::int64_t rows) {
            return g.moe_finalize_all_reduce_add_rmsnorm(
                moe(rows), b.view(b.residual, t, c, rows),
                TensorView::flat(b.gamma.get(), t, kHidden, 0), kEps,
                b.view(b.norm_out, t, c, rows), b.view(b.residual_out, t, c, rows), s);
          },
          [&](std::int64_t rows, int p) {
            b.write(c, rows, p, rank, stream);  // the residual and the outputs
            const auto seed = static_cast<std::uint64_t>(rows * 4 + p + 77);
            testing::fill(stream, experts, t, rows * kTopK * kHidden, seed, rank);
            testing::fill(stream, weights, t, rows * kTopK, seed + 1, rank);
            testing::fill(stream, shared_rows, t, rows * kHidden, seed + 2, rank);
            map_host.clear();
            for (std::int64_t i = 0; i < rows * kTopK; ++i)
              map_host.push_back(static_cast<std::int32_t>(rows * kTopK - 1 - i));
            ASSERT_EQ(cudaMemcpyAsync(map.get(), map_host.data(), map_host.size() * 4,
                                      cudaMemcpyHostToDevice, stream.get()),
                      cudaSuccess);
            for (int k = 0; k < kTokens; ++k) {
              const std::int64_t at = position(k, p, rows);
              if (at < 0) continue;
              // Token k's experts are rows map[at][0] and map[at][1].
              testing::put_row(stream, experts, rows * kTopK - 1 - at * kTopK, e0.input(k, rank));
              testing::put_row(stream, experts, rows * kTopK - 2 - at * kTopK, e1.input(k, rank));
              testing::put_row(stream, shared_rows, at, shared.input(k, rank));
              ASSERT_EQ(cudaMemcpyAsync(weights.bytes_ptr() + at * kTopK * 2,
                                        router[static_cast<std::size_t>(k)].data(), kTopK * 2,
                                        cudaMemcpyHostToDevice, stream.get()),
                        cudaSuccess);
            }
          },
          [&](std::int64_t rows, int p, const char* mode) {
            for (int k = 0; k < kTokens; ++k) {
              const std::int64_t at = position(k, p, rows);
              if (at < 0) continue;
              const std::string what = detail::concat(
                  world, " ranks, ", algo, " (",
                  g.backend_for_moe_finalize(b.view(b.x, t, c, rows),
                                             b.view(b.norm_out, t, c, rows)),
                  "), token ", k, " at row ", at, " of ", rows, ", ", mode, ", rank ", rank);
              const std::string key = detail::concat("token ", k);
              const std::size_t offset = static_cast<std::size_t>(at * kHidden * 2);
              seen.expect_same(key + " norm_out",
                               testing::read(b.norm_out.bytes_ptr() + offset, 2 * kHidden),
                               "norm_out of " + what);
              seen.expect_same(key + " residual_out",
                               testing::read(b.residual_out.bytes_ptr() + offset, 2 * kHidden),
                               "residual_out of " + what);
            }
          }};
      sweep.run(c.batches);
      boot.barrier();
    }
  });
  EXPECT_EQ(seen.differences(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, FusedInvariance, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_ranks";
                         });

// TPCOMM_DETERMINISTIC=1 (read as from the environment): a fused call past the built-in bounds,
// where a default group takes the unfused pair for speed, runs on a fused kernel, with the
// host's residual sums; the default group's path is unchanged, and its unfused pair gives the
// same bits (`Group::all_reduce_add_rmsnorm`: "with the same result").
TEST(DeterministicGroup, FusedKernelsServePastTheBuiltInBounds) {
  for (const int world : {2, 8}) {
    const std::int64_t hidden = 8192;
    const std::int64_t rows = info(Algo::kLamportTwoShot).fused.bound(world) / (hidden * 2) * 2;
    FusedCase c{Tokens(world, hidden, DType::kBF16), kForms[0],
                std::span<const std::int64_t>(kFewBatches)};
    const Bytes gamma = gamma_of(c);
    Seen seen;
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      StreamHolder stream;
      FusedRank b;
      GroupConfig config;
      config.fusion_max_tokens = rows;
      config.fusion_hidden = hidden;
      for (const bool det : {false, true}) {
        Options o = Options::from_lookup([&](const char* name) -> std::optional<std::string> {
          if (det && std::string(name) == "TPCOMM_DETERMINISTIC") return std::string("1");
          return std::nullopt;
        });
        const Options sizes = invariance_options("auto");
        o.custom_ar_max_bytes = sizes.custom_ar_max_bytes;
        o.lamport_max_bytes = sizes.lamport_max_bytes;
        o.timeout_ms = sizes.timeout_ms;
        Group g(boot, 0, o, config);
        EXPECT_EQ(g.options().deterministic, det ? Determinism::kOn : Determinism::kOff);
        const std::string path = g.backend_for_add_rmsnorm(
            b.view(b.x, DType::kBF16, c, rows), b.view(b.norm_out, DType::kBF16, c, rows));
        EXPECT_EQ(path.rfind("custom_ar:lamport", 0) == 0, det) << world << " ranks: " << path;
        b.prepare(gamma, stream);
        for (int p = 0; p < kPlacements; ++p) {
          b.write(c, rows, p, rank, stream);
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          ASSERT_EQ(b.call(g, c, rows, stream.stream()), Status::kOk) << g.last_error();
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          b.check(c, rows, p, detail::concat(c.name(), ", ", path, ", rank ", rank), seen);
        }
        boot.barrier();
      }
    });
    EXPECT_EQ(seen.differences(), 0) << world << " ranks";
  }
}

}  // namespace
}  // namespace tpcomm
