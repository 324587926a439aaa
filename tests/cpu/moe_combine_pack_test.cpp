// SPDX-License-Identifier: Apache-2.0
// The MoE combine as the Lamport kernels' prologue computes it (kernels/common/combine.hpp), run
// on the host: every pack of a rank's combine against the combine's definition (per element, f32
// fmaf over k ascending, then + shared, rounded once; a token whose map names a row outside the
// experts is NaN), bitwise, for f16, bf16 and f32, the whole-pack path (rows of whole packs,
// aligned) and the element path (rows that split packs, misaligned experts or shared), weights
// in f32 or the activation dtype, repeated and unchosen rows, zero weights, top-k over several of
// the batches the whole-pack path reads at once, and zeros past the message. What this cannot show
// (the push, the flags, the epilogue after it) is the gpu tier's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/combine.hpp"

namespace tpcomm {
namespace {

using kernels::MoeCombineParams;
using kernels::Pack;

struct Case {
  std::int64_t tokens;
  std::int64_t hidden;
  int top_k;
  std::int64_t rows;
  bool shared;
  bool weights_f32;
  bool misaligned_experts;  // the experts start one element past a 16-byte boundary
  bool misaligned_shared;
  bool bad_rows;  // token 1's last entry names row `rows`, token 2's first row -1
};

std::string describe(const Case& c) {
  return "tokens " + std::to_string(c.tokens) + " hidden " + std::to_string(c.hidden) + " top_k " +
         std::to_string(c.top_k) + " rows " + std::to_string(c.rows) + (c.shared ? " shared" : "") +
         (c.weights_f32 ? " f32 weights" : "") +
         (c.misaligned_experts ? " misaligned experts" : "") +
         (c.misaligned_shared ? " misaligned shared" : "") + (c.bad_rows ? " bad rows" : "");
}

/// `n` elements of T starting `offset` elements past a 16-byte boundary.
template <class T>
struct Buffer {
  std::vector<Pack<T>> storage;
  T* data;
  Buffer(std::int64_t n, int offset)
      : storage(static_cast<std::size_t>((n + offset) / Pack<T>::kElems + 1)),
        data(reinterpret_cast<T*>(storage.data()) + offset) {}
};

template <class T>
std::uint32_t bits(T x) {
  std::uint32_t b = 0;
  std::memcpy(&b, &x, sizeof(T));
  return b;
}

template <class T>
void check(const Case& c, std::uint32_t seed) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.f, 4.f);
  const std::int64_t count = c.tokens * c.hidden;
  Buffer<T> experts(c.rows * c.hidden, c.misaligned_experts ? 1 : 0);
  for (std::int64_t i = 0; i < c.rows * c.hidden; ++i)
    experts.data[i] = kernels::from_float<T>(value(rng));
  Buffer<T> shared(count, c.misaligned_shared ? 1 : 0);
  for (std::int64_t i = 0; i < count; ++i) shared.data[i] = kernels::from_float<T>(value(rng));
  // Rows drawn with repeats from the first half of the experts, so the rest are never chosen.
  std::uniform_int_distribution<std::int32_t> row(0, static_cast<std::int32_t>(c.rows / 2));
  std::vector<std::int32_t> map(static_cast<std::size_t>(c.tokens * c.top_k));
  for (auto& r : map) r = row(rng);
  if (c.bad_rows) {
    const auto k = static_cast<std::size_t>(c.top_k);
    map[k + k - 1] = static_cast<std::int32_t>(c.rows);  // token 1's last
    map[2 * k] = -1;                                     // token 2's first
  }
  std::vector<float> weights_f32(map.size());
  std::vector<T> weights(map.size());
  for (std::size_t i = 0; i < map.size(); ++i) {
    // Every fifth weight zero; the others rounded into T, so both forms give the same weights.
    weights[i] = kernels::from_float<T>(i % 5 == 3 ? 0.f : value(rng) / 4.f);
    weights_f32[i] = kernels::to_float(weights[i]);
  }
  MoeCombineParams m{};
  m.experts = experts.data;
  m.map = map.data();
  m.weights = c.weights_f32 ? static_cast<const void*>(weights_f32.data()) : weights.data();
  m.shared = c.shared ? shared.data : nullptr;
  m.tokens = c.tokens;
  m.rows = c.rows;
  m.hidden = c.hidden;
  m.top_k = c.top_k;
  m.weights_f32 = c.weights_f32;

  // The combine's definition, element by element.
  std::vector<float> want(static_cast<std::size_t>(count));
  for (std::int64_t t = 0; t < c.tokens; ++t)
    for (std::int64_t h = 0; h < c.hidden; ++h) {
      float acc = 0.f;
      for (int k = 0; k < c.top_k && !std::isnan(acc); ++k) {
        const std::int32_t r = map[static_cast<std::size_t>(t * c.top_k + k)];
        acc = r < 0 || r >= c.rows
                  ? NAN
                  : std::fma(weights_f32[static_cast<std::size_t>(t * c.top_k + k)],
                             kernels::to_float(experts.data[r * c.hidden + h]), acc);
      }
      if (c.shared) acc += kernels::to_float(shared.data[t * c.hidden + h]);
      want[static_cast<std::size_t>(t * c.hidden + h)] =
          kernels::to_float(kernels::from_float<T>(acc));
    }

  constexpr int W = Pack<T>::kElems;
  const std::int64_t packs = (count + W - 1) / W;
  int wrong = 0;
  for (std::int64_t v = 0; v <= packs; ++v) {  // one pack past the message: zeros
    const Pack<T> got = kernels::combine_pack<T>(m, v, count);
    for (int j = 0; j < W && wrong < 5; ++j) {
      const std::int64_t e = v * W + j;
      const T g = got[j];
      if (e >= count) {
        if (bits(g) != 0) {
          ADD_FAILURE() << "pack " << v << " element " << e << " past the message is not zero";
          ++wrong;
        }
        continue;
      }
      const float w = want[static_cast<std::size_t>(e)];
      const bool same = std::isnan(w) ? std::isnan(kernels::to_float(g))
                                      : bits(g) == bits(kernels::from_float<T>(w));
      if (!same) {
        ADD_FAILURE() << "element " << e << " (token " << e / c.hidden << ", column "
                      << e % c.hidden << "): got " << kernels::to_float(g) << ", want " << w;
        ++wrong;
      }
    }
  }
}

const Case kCases[] = {
    // tokens hidden top_k rows shared f32w mis_e mis_s bad
    {1, 7168, 8, 64, false, true, false, false, false},  // DeepSeek-V3 at one token
    {4, 7168, 8, 64, true, true, false, false, true},
    {3, 4096, 1, 8, false, false, false, false, false},  // top-k 1
    {5, 256, 2, 16, true, false, false, false, true},
    {3, 1001, 8, 40, true, true, false, false, true},  // rows that split packs
    {4, 256, 8, 40, false, true, true, false, false},  // misaligned experts
    {4, 256, 4, 20, true, false, false, true, false},  // misaligned shared
    {7, 24, 3, 9, true, true, true, true, true},       // everything on the element path
    {2, 3, 32, 64, true, false, false, false, false},  // most experts per token, tiny rows
    // Whole packs over several batches of experts (kernels::kCombineBatch), the last one part
    // full, a bad row in a later batch; and the most experts per token.
    {3, 64, 13, 40, true, true, false, false, true},
    {2, 128, 32, 96, false, false, false, false, false},
};

TEST(MoeCombinePack, EveryPackIsTheCombinesDefinitionBf16) {
  std::uint32_t seed = 1;
  for (const Case& c : kCases) check<__nv_bfloat16>(c, seed++);
}

TEST(MoeCombinePack, EveryPackIsTheCombinesDefinitionF16) {
  std::uint32_t seed = 100;
  for (const Case& c : kCases) check<__half>(c, seed++);
}

TEST(MoeCombinePack, EveryPackIsTheCombinesDefinitionF32) {
  std::uint32_t seed = 200;
  for (const Case& c : kCases) check<float>(c, seed++);
}

}  // namespace
}  // namespace tpcomm
