// SPDX-License-Identifier: Apache-2.0
// The fused all-reduce + residual add + RMSNorm (+ FP8) through Group, with virtual ranks on one
// GPU, against a host reference in double precision: the fused kernels and every fallback,
// exact residual sums, bitwise equality across ranks, in place, graphs, a missing rank.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/norm.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::options_for;
using testing::run_ranks;
using testing::StreamHolder;

constexpr float kEps = 1e-5f;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/// 16-bit (or 32-bit) encodings of host floats in `dtype`.
std::uint32_t encode(float v, DType dtype) {
  if (dtype == DType::kBF16) {
    const __nv_bfloat16 b = __float2bfloat16(v);
    std::uint16_t bits = 0;
    std::memcpy(&bits, &b, 2);
    return bits;
  }
  if (dtype == DType::kF16) {
    const __half h = __float2half(v);
    std::uint16_t bits = 0;
    std::memcpy(&bits, &h, 2);
    return bits;
  }
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, 4);
  return bits;
}

double decode(const unsigned char* p, DType dtype) {
  if (dtype == DType::kBF16) {
    __nv_bfloat16 b;
    std::memcpy(&b, p, 2);
    return static_cast<double>(__bfloat162float(b));
  }
  if (dtype == DType::kF16) {
    __half h;
    std::memcpy(&h, p, 2);
    return static_cast<double>(__half2float(h));
  }
  if (dtype == DType::kF8E4M3) {
    __nv_fp8_e4m3 q;
    std::memcpy(&q, p, 1);
    return static_cast<double>(static_cast<float>(q));
  }
  float f = 0;
  std::memcpy(&f, p, 4);
  return f;
}

/// A tensor's bytes on the host, from floats.
std::vector<unsigned char> host_tensor(const std::vector<float>& values, DType dtype) {
  const std::size_t es = dtype_size(dtype);
  std::vector<unsigned char> out(values.size() * es);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint32_t bits = encode(values[i], dtype);
    std::memcpy(out.data() + i * es, &bits, es);
  }
  return out;
}

/// One fused case: every rank's inputs (small integers, -0.0 among the zeros, so every sum is
/// exact), the expected outputs, and tolerances for the norm.
struct FusedCase {
  int world;
  std::int64_t tokens;
  std::int64_t hidden;
  DType dtype = DType::kBF16;
  DType norm_dtype = DType::kBF16;  // or kF8E4M3
  bool in_place = false;
  bool row_scales = false;  // FP8: per-row scales instead of the per-tensor one
  // The forms of the norm (tpcomm/norm.hpp).
  bool group_scales = false;  // FP8: per-group scales
  bool no_residual = false;
  bool gamma_f32 = false;
  bool plus_one = false;  // Gemma's 1 + gamma

  [[nodiscard]] std::int64_t count() const { return tokens * hidden; }
  [[nodiscard]] std::int64_t groups() const { return hidden / kernels::kFp8Group; }
  [[nodiscard]] std::string name() const {
    return detail::concat("world ", world, " tokens ", tokens, " hidden ", hidden, " ",
                          to_string(dtype), " -> ", to_string(norm_dtype),
                          in_place ? " in place" : "", row_scales ? " row scales" : "",
                          group_scales ? " group scales" : "", no_residual ? " no residual" : "",
                          gamma_f32 ? " f32 gamma" : "", plus_one ? " 1 + gamma" : "");
  }
};

/// `c` in one of the norm's forms (`form`: bits no residual 1, f32 gamma 2, 1 + gamma 4).
FusedCase with_form(FusedCase c, int form) {
  c.no_residual = (form & 1) != 0;
  c.gamma_f32 = (form & 2) != 0;
  c.plus_one = (form & 4) != 0;
  return c;
}

/// `c` with FP8 group scales.
FusedCase per_group(FusedCase c) {
  c.norm_dtype = DType::kF8E4M3;
  c.group_scales = true;
  return c;
}

struct Reference {
  std::vector<std::vector<float>> x;  // per rank
  std::vector<float> residual, gamma;
  std::vector<double> residual_out, norm;  // norm before quantisation
  float scale = 0;                         // per-tensor FP8 scale
};

Reference make_reference(const FusedCase& c, std::uint64_t seed) {
  Reference ref;
  const auto n = static_cast<std::size_t>(c.count());
  ref.x.assign(static_cast<std::size_t>(c.world), std::vector<float>(n));
  ref.residual.resize(n);
  ref.residual_out.resize(n);
  ref.norm.resize(n);
  ref.gamma.resize(static_cast<std::size_t>(c.hidden));
  for (std::size_t i = 0; i < n; ++i) {
    for (int r = 0; r < c.world; ++r) {
      const std::uint64_t h = mix(seed ^ (static_cast<std::uint64_t>(r) << 56) ^ i);
      float v = static_cast<float>(static_cast<int>(h % 9) - 4);
      if (v == 0 && (h >> 20) % 2 == 0) v = -0.0f;
      ref.x[static_cast<std::size_t>(r)][i] = v;
    }
    const std::uint64_t h = mix(seed ^ 0x5e5e5e5eull ^ (i << 8));
    ref.residual[i] = c.no_residual ? 0.f : static_cast<float>(static_cast<int>(h % 17) - 8);
  }
  // Gamma near 1 (near 0 for Gemma's 1 + gamma); an f32 gamma carries bits that the input's
  // dtype cannot hold.
  for (std::size_t j = 0; j < ref.gamma.size(); ++j) {
    float g = static_cast<float>(mix(seed + j * 31) % 64 + 32) / 64.0f;
    if (c.plus_one) g -= 1.f;
    if (c.gamma_f32) g += 1.f / 8192;
    ref.gamma[j] = g;
  }
  const double offset = c.plus_one ? 1.0 : 0.0;
  double amax = 0;
  for (std::int64_t row = 0; row < c.tokens; ++row) {
    double squares = 0;
    for (std::int64_t j = 0; j < c.hidden; ++j) {
      const auto i = static_cast<std::size_t>(row * c.hidden + j);
      double v = ref.residual[i];
      for (int r = 0; r < c.world; ++r) v += ref.x[static_cast<std::size_t>(r)][i];
      ref.residual_out[i] = v;
      squares += v * v;
    }
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(c.hidden) + kEps);
    for (std::int64_t j = 0; j < c.hidden; ++j) {
      const auto i = static_cast<std::size_t>(row * c.hidden + j);
      ref.norm[i] = ref.residual_out[i] * rstd * (ref.gamma[static_cast<std::size_t>(j)] + offset);
      amax = std::max(amax, std::abs(ref.norm[i]));
    }
  }
  ref.scale = static_cast<float>(std::max(amax, 1.0) / 200.0);  // well inside e4m3's range
  return ref;
}

/// What one rank got, for the cross-rank comparison.
struct Got {
  std::vector<unsigned char> residual_out, norm_out, row_scales;
  friend bool operator==(const Got&, const Got&) = default;
};

/// Counts the elements of `got` that are off the reference.
std::int64_t wrong_elements(const FusedCase& c, const Reference& ref, const Got& got) {
  const std::size_t es = dtype_size(c.dtype);
  const std::size_t ns = dtype_size(c.norm_dtype);
  std::int64_t bad = 0;
  // The scale `got` holds for elements [lo, lo + n) of the flat message (its `k`th scale),
  // checked against the reference's.
  auto dynamic_scale = [&](std::int64_t k, std::int64_t lo, std::int64_t n) {
    float s = 0;
    std::memcpy(&s, got.row_scales.data() + k * 4, 4);
    double amax = 0;
    for (std::int64_t i = lo; i < lo + n; ++i)
      amax = std::max(amax, std::abs(ref.norm[static_cast<std::size_t>(i)]));
    const double expected = std::max(amax / 448.0, 1.0 / (448.0 * 512.0));
    if (!(std::abs(s - expected) <= 2e-2 * expected)) ++bad;
    return static_cast<double>(s);
  };
  for (std::int64_t row = 0; row < c.tokens; ++row) {
    double row_scale = ref.scale;
    if (c.norm_dtype == DType::kF8E4M3 && c.row_scales)
      row_scale = dynamic_scale(row, row * c.hidden, c.hidden);
    for (std::int64_t j = 0; j < c.hidden; ++j) {
      const auto i = static_cast<std::size_t>(row * c.hidden + j);
      if (c.group_scales && j % kernels::kFp8Group == 0)
        row_scale = dynamic_scale(row * c.groups() + j / kernels::kFp8Group, row * c.hidden + j,
                                  kernels::kFp8Group);
      if (decode(got.residual_out.data() + i * es, c.dtype) != ref.residual_out[i]) ++bad;
      const double value = decode(got.norm_out.data() + i * ns, c.norm_dtype);
      const double y = ref.norm[i];
      double expected = y, tolerance = 0;
      if (c.norm_dtype == DType::kF8E4M3) {
        expected = y / row_scale;
        tolerance = 0.07 * std::abs(expected) + 1.0 / 256;
      } else {
        tolerance = (c.dtype == DType::kF16 ? 2e-3 : 1.6e-2) * std::abs(y) + 1e-3;
      }
      if (!(std::abs(value - expected) <= tolerance)) ++bad;
    }
  }
  return bad;
}

/// Device buffers of one rank, sized for the largest case it runs (allocated once: freeing while
/// a peer's kernel waits for this rank would wait for it).
struct RankBuffers {
  explicit RankBuffers(std::int64_t max_count, std::int64_t max_hidden, std::int64_t max_tokens)
      : x(max_count * 4 + 64),
        residual(max_count * 4 + 64),
        norm_out(max_count * 4 + 64),
        residual_out(max_count * 4 + 64),
        gamma(max_hidden * 4 + 64),
        scale(64),
        row_scales(std::max(max_tokens, max_count / kernels::kFp8Group) * 4 + 64) {}
  DeviceBuffer x, residual, norm_out, residual_out, gamma, scale, row_scales;
};

/// The tensors of case `c` over one rank's buffers, and the call's other arguments.
struct CaseCall {
  TensorView x, residual, gamma, norm_out, residual_out;
  Fp8Scales fp8;
  NormWeight weight = NormWeight::kGamma;

  Status run(Group& g, Stream s) const {
    return g.all_reduce_add_rmsnorm(x, residual, gamma, kEps, norm_out, residual_out, s, fp8,
                                    weight);
  }
};

CaseCall call_of(const FusedCase& c, RankBuffers& b) {
  auto view = [&](void* p, DType t) {
    return TensorView::contiguous(p, t, {c.tokens, c.hidden}, 0);
  };
  CaseCall call;
  call.x = view(b.x.get(), c.dtype);
  // Without a residual, in place means residual_out in the residual's buffer all the same.
  const TensorView residual_buffer = view(b.residual.get(), c.dtype);
  call.residual = c.no_residual ? TensorView{} : residual_buffer;
  call.residual_out = c.in_place ? residual_buffer : view(b.residual_out.get(), c.dtype);
  call.norm_out =
      c.in_place && c.norm_dtype == c.dtype ? call.x : view(b.norm_out.get(), c.norm_dtype);
  call.gamma = TensorView::flat(b.gamma.get(), c.gamma_f32 ? DType::kF32 : c.dtype, c.hidden, 0);
  if (c.norm_dtype == DType::kF8E4M3) {
    if (c.row_scales)
      call.fp8.row_scales = TensorView::flat(b.row_scales.get(), DType::kF32, c.tokens, 0);
    else if (c.group_scales)
      call.fp8.group_scales =
          TensorView::contiguous(b.row_scales.get(), DType::kF32, {c.tokens, c.groups()}, 0);
    else
      call.fp8.scale = TensorView::flat(b.scale.get(), DType::kF32, 1, 0);
  }
  call.weight = c.plus_one ? NormWeight::kOnePlusGamma : NormWeight::kGamma;
  return call;
}

/// Uploads this rank's inputs of `ref` and poisons every output, in order on `s` (a plain
/// cudaMemcpy from pageable memory may return before its copy reaches the device, unordered
/// with the non-blocking stream).
void upload(const FusedCase& c, int rank, const Reference& ref, RankBuffers& b, Stream s) {
  const auto cs = reinterpret_cast<cudaStream_t>(s);
  const auto bytes = static_cast<std::size_t>(c.count()) * dtype_size(c.dtype);
  const auto x_host = host_tensor(ref.x[static_cast<std::size_t>(rank)], c.dtype);
  const auto residual_host = host_tensor(ref.residual, c.dtype);
  const auto gamma_host = host_tensor(ref.gamma, c.gamma_f32 ? DType::kF32 : c.dtype);
  ASSERT_EQ(cudaMemcpyAsync(b.x.get(), x_host.data(), bytes, cudaMemcpyHostToDevice, cs),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(b.residual.get(), residual_host.data(), bytes, cudaMemcpyHostToDevice, cs),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.gamma.get(), gamma_host.data(), gamma_host.size(),
                            cudaMemcpyHostToDevice, cs),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b.scale.get(), &ref.scale, 4, cudaMemcpyHostToDevice, cs), cudaSuccess);
  for (DeviceBuffer* p : {&b.norm_out, &b.residual_out, &b.row_scales})
    ASSERT_EQ(kernels::poison(p->get(), static_cast<std::int64_t>(p->size()), s), Status::kOk);
}

/// What `call` wrote, once its stream is synchronised.
Got download(const FusedCase& c, const CaseCall& call) {
  const auto n = static_cast<std::size_t>(c.count());
  Got got;
  got.residual_out = testing::to_host(call.residual_out.data, n * dtype_size(c.dtype));
  got.norm_out = testing::to_host(call.norm_out.data, n * dtype_size(c.norm_dtype));
  if (c.row_scales)
    got.row_scales =
        testing::to_host(call.fp8.row_scales.data, static_cast<std::size_t>(c.tokens) * 4);
  if (c.group_scales)
    got.row_scales = testing::to_host(call.fp8.group_scales.data,
                                      static_cast<std::size_t>(c.tokens * c.groups()) * 4);
  return got;
}

/// Runs `c` on this rank: upload, poison, the fused call, download, check.
void run_fused(Group& g, int rank, const FusedCase& c, const Reference& ref, RankBuffers& b,
               Stream s, Got* got) {
  upload(c, rank, ref, b, s);
  const CaseCall call = call_of(c, b);
  ASSERT_EQ(call.run(g, s), Status::kOk) << g.last_error();
  ASSERT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s)), cudaSuccess);
  ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
  *got = download(c, call);
  EXPECT_EQ(wrong_elements(c, ref, *got), 0)
      << c.name() << " rank " << rank << " on " << g.backend_for_add_rmsnorm(call.x, call.norm_out);
}

/// Runs every case of one world size on one group per rank, checking bitwise equality across
/// ranks; `expect_path` checks the path each case takes.
void run_cases(int world, const std::vector<FusedCase>& cases, const Options& options,
               const std::function<void(const FusedCase&, const std::string&)>& expect_path = {},
               GroupConfig config = {}) {
  std::int64_t max_count = 1, max_hidden = 1, max_tokens = 1;
  for (const FusedCase& c : cases) {
    max_count = std::max(max_count, c.count());
    max_hidden = std::max(max_hidden, c.hidden);
    max_tokens = std::max(max_tokens, c.tokens);
  }
  std::vector<Reference> refs;
  for (const FusedCase& c : cases) refs.push_back(make_reference(c, fresh_seed()));
  std::vector<std::vector<Got>> got(static_cast<std::size_t>(world),
                                    std::vector<Got>(cases.size()));
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, options, config);
    StreamHolder stream;
    RankBuffers buffers(max_count, max_hidden, max_tokens);
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const FusedCase& c = cases[i];
      if (expect_path && rank == 0) {
        const auto v = TensorView::contiguous(nullptr, c.dtype, {c.tokens, c.hidden}, 0);
        const auto nv = TensorView::contiguous(nullptr, c.norm_dtype, {c.tokens, c.hidden}, 0);
        (void)v;
        expect_path(c, g.backend_for_add_rmsnorm(v, nv));
      }
      run_fused(g, rank, c, refs[i], buffers, stream.stream(),
                &got[static_cast<std::size_t>(rank)][i]);
    }
    boot.barrier();  // no rank frees its buffers while a peer may still read them
  });
  for (std::size_t i = 0; i < cases.size(); ++i)
    for (int r = 1; r < world; ++r)
      EXPECT_TRUE(got[static_cast<std::size_t>(r)][i] == got[0][i])
          << cases[i].name() << ": rank " << r << " differs from rank 0";
}

Options fused_options(const std::string& algo = "auto") {
  Options o = options_for(algo, 32 << 20);
  o.lamport_max_bytes = 4 << 20;
  return o;
}

// Every token count and hidden size of the grid on 4 ranks (those whose input exceeds 16 MiB
// are left out: the all-reduce of the fallback needs a backend on one GPU), each on the path the
// selector picks: fused where the workspace holds it, the fallback beyond.
TEST(AllReduceAddRmsNorm, GridOnFourRanks) {
  std::vector<FusedCase> cases;
  for (std::int64_t tokens : {1, 2, 3, 8, 17, 128, 511, 2048})
    for (std::int64_t hidden : {1, 7, 128, 2880, 4096, 5120, 7168, 8192, 16384})
      if (tokens * hidden <= (std::int64_t{8} << 20)) cases.push_back({4, tokens, hidden});
  int fused = 0, fallback = 0;
  run_cases(4, cases, fused_options(), [&](const FusedCase& c, const std::string& path) {
    const std::int64_t bytes = c.count() * 2;
    // Up to the Lamport two-shot's built-in bound (its slots of 4 MiB hold more): fused.
    const bool fits = bytes <= info(Algo::kLamportTwoShot).fused.bound(4);
    EXPECT_EQ(path.rfind("custom_ar:lamport", 0) == 0, fits) << c.name() << ": " << path;
    (fits ? fused : fallback) += 1;
  });
  EXPECT_GT(fused, 0);
  EXPECT_GT(fallback, 0);
}

class FusedWorlds : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

// Each fused algorithm on 2, 3, 4 and 8 ranks: both dtypes, in place, FP8 with a per-tensor
// scale and with row scales, rows that do not start on a 16-byte boundary.
TEST_P(FusedWorlds, MatchTheReferenceBitwiseAlike) {
  const auto [world, algo] = GetParam();
  std::vector<FusedCase> cases;
  for (std::int64_t tokens : {1, 3, 17, 128})
    for (std::int64_t hidden : {7, 128, 2880, 7168}) {
      cases.push_back({world, tokens, hidden});
      cases.push_back({world, tokens, hidden, DType::kF16, DType::kF16, true});
    }
  for (std::int64_t hidden : {7, 4096}) {
    cases.push_back({world, 5, hidden, DType::kBF16, DType::kF8E4M3});
    cases.push_back({world, 5, hidden, DType::kBF16, DType::kF8E4M3, true});
    cases.push_back({world, 5, hidden, DType::kF16, DType::kF8E4M3, false, true});
    cases.push_back({world, 9, hidden, DType::kBF16, DType::kF8E4M3, true, true});
  }
  // The forms: every combination of no residual, an f32 gamma and 1 + gamma, with both dtypes,
  // in place and not, rows that do not start on a 16-byte boundary; and per-group FP8 scales.
  for (int form = 1; form < 8; ++form) {
    cases.push_back(with_form({world, 3, 2880}, form));
    cases.push_back(with_form({world, 17, 7, DType::kF16, DType::kF16, true}, form));
    cases.push_back(with_form({world, 2, 7168, DType::kBF16, DType::kF8E4M3, false, true}, form));
  }
  for (std::int64_t tokens : {1, 5, 128}) {
    cases.push_back(per_group({world, tokens, 7168}));
    cases.push_back(per_group({world, tokens, 128, DType::kF16}));
    cases.push_back(
        with_form(per_group({world, tokens, 2048, DType::kBF16, DType::kBF16, true}), 7));
  }
  run_cases(world, cases, fused_options(algo), [&](const FusedCase& c, const std::string& path) {
    EXPECT_EQ(path, "custom_ar:" + algo) << c.name();
  });
}

INSTANTIATE_TEST_SUITE_P(Algorithms, FusedWorlds,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values(std::string("lamport"),
                                                              std::string("lamport_two_shot"))),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// Where no fused kernel serves the call, the group's all-reduce and the local kernel give the
// same answer: world size 1, a group without the fusion workspace (every in-place form, FP8
// included), f32.
TEST(AllReduceAddRmsNorm, FallbacksGiveTheSameAnswer) {
  std::vector<FusedCase> one = {{1, 3, 4096}, {1, 2, 7, DType::kF16, DType::kF8E4M3, true}};
  run_cases(1, one, fused_options(), [](const FusedCase& c, const std::string& path) {
    EXPECT_EQ(path, "local+add_rmsnorm") << c.name();
  });
  std::vector<FusedCase> cases;
  for (bool in_place : {false, true}) {
    cases.push_back({4, 17, 2880, DType::kBF16, DType::kBF16, in_place});
    cases.push_back({4, 3, 7, DType::kBF16, DType::kF8E4M3, in_place});
    cases.push_back({4, 3, 4096, DType::kF16, DType::kF8E4M3, in_place, true});
    cases.push_back(per_group({4, 3, 4096, DType::kBF16, DType::kBF16, in_place}));
    for (int form = 1; form < 8; ++form) {
      cases.push_back(with_form({4, 5, 2880, DType::kBF16, DType::kBF16, in_place}, form));
      cases.push_back(with_form({4, 3, 7, DType::kF16, DType::kF8E4M3, in_place}, form));
    }
  }
  run_cases(
      4, cases, fused_options(),
      [](const FusedCase& c, const std::string& path) {
        EXPECT_EQ(path.find("+add_rmsnorm"), path.size() - 12) << c.name() << ": " << path;
      },
      GroupConfig{true, true, /*fusion=*/false});
  run_cases(4,
            {{4, 5, 1000, DType::kF32, DType::kF32},
             {4, 2, 7, DType::kF32, DType::kF32, true},
             with_form({4, 3, 7, DType::kF32, DType::kF32, true}, 5),
             per_group({4, 2, 256, DType::kF32, DType::kF32, true})},
            fused_options(), [](const FusedCase& c, const std::string& path) {
              EXPECT_NE(path.find("+add_rmsnorm"), std::string::npos) << c.name() << ": " << path;
            });
}

// Captured once, replayed with new inputs: each replay matches its own reference; the plain
// form, and every form at once with per-group FP8 scales.
TEST(AllReduceAddRmsNorm, GraphReplayWithNewInputs) {
  const int world = 4;
  for (const char* algo : {"lamport", "lamport_two_shot"}) {
    for (const FusedCase& c :
         {FusedCase{world, 17, 2880}, with_form(per_group({world, 9, 1024}), 7)}) {
      std::vector<Reference> refs;
      for (int replay = 0; replay < 3; ++replay) refs.push_back(make_reference(c, fresh_seed()));
      run_ranks(world, [&](int rank, Bootstrap& boot) {
        Group g(boot, 0, fused_options(algo));
        StreamHolder stream;
        const cudaStream_t s = stream.get();
        RankBuffers b(c.count(), c.hidden, c.tokens);
        const CaseCall call = call_of(c, b);
        {
          const testing::CapturedGraph graph(g, stream.stream(), [&] {
            EXPECT_EQ(call.run(g, stream.stream()), Status::kOk) << g.last_error();
          });
          ASSERT_TRUE(graph.ok());
          for (const Reference& ref : refs) {
            upload(c, rank, ref, b, stream.stream());
            ASSERT_EQ(graph.launch(), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
            ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
            EXPECT_EQ(wrong_elements(c, ref, download(c, call)), 0)
                << algo << " " << c.name() << " rank " << rank;
          }
        }
        boot.barrier();
      });
    }
  }
}

// A rank that never arrives: the others time out with the usual report, naming it.
TEST(AllReduceAddRmsNorm, MissingRankTimesOut) {
  const int world = 4;
  for (const char* algo : {"lamport", "lamport_two_shot"}) {
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      SCOPED_TRACE(algo);
      Options o = fused_options(algo);
      o.timeout_ms = 500;
      Group g(boot, 0, o);
      StreamHolder stream;
      RankBuffers b(8 * 4096, 4096, 8);
      auto view = [&](const DeviceBuffer& p) {
        return TensorView::contiguous(p.get(), DType::kBF16, {8, 4096}, 0);
      };
      ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
      if (rank != 0) {
        ASSERT_EQ(
            g.all_reduce_add_rmsnorm(view(b.x), view(b.residual),
                                     TensorView::flat(b.gamma.get(), DType::kBF16, 4096, 0), kEps,
                                     view(b.norm_out), view(b.residual_out), stream.stream()),
            Status::kOk);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_EQ(g.health(), Status::kTimeout);
        EXPECT_NE(g.last_error().find("timed out waiting for rank"), std::string::npos)
            << g.last_error();
        // The one-shot waits only for rank 0's data. In the two-shot a rank may first give up on
        // a slice owner that itself waits for rank 0 (which wait reports first is a race).
        if (std::string(algo) == "lamport") {
          EXPECT_NE(g.last_error().find("waiting for rank 0"), std::string::npos) << g.last_error();
        }
      }
      boot.barrier();
    });
  }
}

// Bad arguments are clear errors that leave the group usable.
TEST(AllReduceAddRmsNorm, BadArgumentsAreClearErrors) {
  run_ranks(2, [&](int, Bootstrap& boot) {
    Group g(boot, 0, fused_options());
    StreamHolder stream;
    DeviceBuffer a(4096 * 2 * 4), r(4096 * 2 * 4), n(4096 * 2 * 4), o(4096 * 2 * 4), w(4096 * 4);
    auto v = [](const DeviceBuffer& p, DType t = DType::kBF16) {
      return TensorView::contiguous(p.get(), t, {4, 4096}, 0);
    };
    const auto gamma = TensorView::flat(w.get(), DType::kBF16, 4096, 0);
    const auto s = stream.stream();
    auto expect_error = [&](Status st, const char* words) {
      EXPECT_EQ(st, Status::kInvalidArgument);
      EXPECT_NE(g.last_error().find(words), std::string::npos) << g.last_error();
    };
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r), TensorView::flat(w.get(), DType::kBF16, 7, 0),
                                          kEps, v(n), v(o), s),
                 "gamma must hold 4096");
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r, DType::kF16), gamma, kEps, v(n), v(o), s),
                 "residual's dtype");
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(n, DType::kF8E4M3), v(o), s),
                 "give its per-tensor scale");
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r), gamma, -1.0f, v(n), v(o), s), "eps");
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(o), v(o), s),
                 "norm_out overlaps residual_out");
    expect_error(
        g.all_reduce_add_rmsnorm(v(a), v(r), TensorView::flat(w.get(), DType::kF16, 4096, 0), kEps,
                                 v(n), v(o), s),
        "gamma must hold 4096 elements of bfloat16 or float");
    expect_error(g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(n), v(o), s, {},
                                          static_cast<NormWeight>(9)),
                 "weight 9 is not a NormWeight");
    Fp8Scales scales;
    scales.group_scales = TensorView::flat(n.get(), DType::kF32, 4 * 4096 / 128 - 1, 0);
    expect_error(
        g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(o, DType::kF8E4M3), v(r), s, scales),
        "the FP8 group scales must be 128 contiguous f32 elements");
    scales.scale = TensorView::flat(n.get(), DType::kF32, 1, 0);
    expect_error(
        g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(o, DType::kF8E4M3), v(r), s, scales),
        "not several");
    auto narrow = [](const DeviceBuffer& p, DType t = DType::kBF16) {
      return TensorView::contiguous(p.get(), t, {4, 100}, 0);
    };
    scales = {};
    scales.group_scales = TensorView::flat(n.get(), DType::kF32, 4, 0);
    expect_error(g.all_reduce_add_rmsnorm(narrow(a), narrow(r),
                                          TensorView::flat(w.get(), DType::kBF16, 100, 0), kEps,
                                          narrow(o, DType::kF8E4M3), narrow(r), s, scales),
                 "a multiple of 128");
    EXPECT_EQ(g.health(), Status::kOk);
    EXPECT_EQ(g.all_reduce_add_rmsnorm(v(a), v(r), gamma, kEps, v(n), v(o), s), Status::kOk)
        << g.last_error();
    EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    boot.barrier();
  });
}

}  // namespace
}  // namespace tpcomm
