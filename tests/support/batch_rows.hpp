// SPDX-License-Identifier: Apache-2.0
// What the batch-invariance tests share (tests/gpu/determinism*_test.cpp): token rows of random
// 16-bit values with the host's sums, where they sit in a batch, the record of what every rank
// saw, and one rank's sweep of an operation over batches, eager and from graphs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm::testing {

using Bytes = std::vector<unsigned char>;

inline constexpr std::int64_t kMaxBatch = 2048;
inline constexpr std::int64_t kMaxHidden = 8192;
inline constexpr std::int64_t kMaxBytes = kMaxBatch * kMaxHidden * 2;
inline constexpr int kTokens = 2;      // token rows followed through every batch
inline constexpr int kPlacements = 2;  // their places in each batch (`position`)
inline constexpr std::int64_t kAllBatches[] = {1, 2, 3, 16, 64, 256, 1024, 2048};
inline constexpr std::int64_t kFewBatches[] = {1, 3, 64, 2048};

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/// `v` rounded to the nearest `t` (bf16 or f16), as bits.
inline std::uint16_t to_bits(float v, DType t) {
  if (t == DType::kBF16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16(v)).x;
  return static_cast<__half_raw>(__float2half(v)).x;
}

inline float from_bits(std::uint16_t bits, DType t) {
  if (t == DType::kBF16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

/// The row of token `k` in placement `p` of a batch of `rows`, or -1 where it has no room (a
/// batch of one row holds token `p` alone).
inline std::int64_t position(int k, int p, std::int64_t rows) {
  if (rows == 1) return k == p ? 0 : -1;
  if (p == 0) return k == 0 ? 0 : rows - 1;
  return k == 0 ? rows / 2 : rows / 2 - 1;
}

/// The token rows of one world size, hidden size and dtype: every rank's inputs and the
/// residual, random and never zero, fixed by the token's number and `salt`; and the host's sums.
struct Tokens {
  int world;
  std::int64_t hidden;
  DType dtype;
  std::vector<std::vector<std::uint16_t>> x;         // [token * world + rank]
  std::vector<std::vector<std::uint16_t>> residual;  // [token]
  std::vector<Bytes> sum, sum_residual;              // [token]

  Tokens(int w, std::int64_t h, DType t, std::uint64_t salt = 0) : world(w), hidden(h), dtype(t) {
    auto row = [&](std::uint64_t key) {
      std::vector<std::uint16_t> out;
      for (std::int64_t j = 0; j < h; ++j) {
        const std::uint64_t r = mix((key + salt * 977) * 0x9e3779b97f4a7c15ull + j);
        const float mag = static_cast<float>(r % 60000 + 1) / 16384.f;  // (0, 3.7]
        out.push_back(to_bits((r >> 40) % 2 != 0 ? -mag : mag, t));
      }
      return out;
    };
    for (int k = 0; k < kTokens; ++k) {
      for (int r = 0; r < w; ++r) x.push_back(row(static_cast<std::uint64_t>(k * 64 + r + 1)));
      residual.push_back(row(static_cast<std::uint64_t>(k * 64 + 63)));
    }
    for (int k = 0; k < kTokens; ++k) {
      sum.push_back(host_sum(k, false));
      sum_residual.push_back(host_sum(k, true));
    }
  }
  [[nodiscard]] const std::vector<std::uint16_t>& input(int k, int rank) const {
    return x[static_cast<std::size_t>(k * world + rank)];
  }
  [[nodiscard]] std::size_t row_bytes() const { return static_cast<std::size_t>(hidden) * 2; }
  [[nodiscard]] std::string name() const {
    return detail::concat(world, " ranks, hidden ", hidden, ", ", to_string(dtype));
  }

 private:
  // The fp32 sum over ranks in rank order, rounded once; with the residual, that plus the
  // residual in fp32, rounded once more (`Fused::add` in kernels/common/epilogue.cuh).
  Bytes host_sum(int k, bool with_residual) const {
    Bytes out(row_bytes());
    for (std::int64_t j = 0; j < hidden; ++j) {
      const auto i = static_cast<std::size_t>(j);
      float acc = from_bits(input(k, 0)[i], dtype);
      for (int r = 1; r < world; ++r) acc += from_bits(input(k, r)[i], dtype);
      std::uint16_t bits = to_bits(acc, dtype);
      if (with_residual)
        bits = to_bits(
            from_bits(bits, dtype) + from_bits(residual[static_cast<std::size_t>(k)][i], dtype),
            dtype);
      std::memcpy(out.data() + i * 2, &bits, 2);
    }
    return out;
  }
};

/// What every rank saw, shared by the ranks: each sighting must equal the host's bytes, or the
/// first sighting under its key, bitwise. The first few differences are reported in full.
class Seen {
 public:
  void expect_equal(const Bytes& want, const Bytes& got, const std::string& what) {
    if (want != got) report(what + ": differs bitwise from the host's sum");
  }
  void expect_same(const std::string& key, const Bytes& got, const std::string& what) {
    std::lock_guard lock(m_);
    const auto [it, first] = seen_.try_emplace(key, got, what);
    if (!first && it->second.first != got)
      report_locked(what + ": differs from " + it->second.second);
  }
  [[nodiscard]] int differences() const { return differences_; }

 private:
  void report(const std::string& what) {
    std::lock_guard lock(m_);
    report_locked(what);
  }
  void report_locked(const std::string& what) {
    if (++differences_ <= 8) ADD_FAILURE() << what;
  }
  std::mutex m_;
  std::map<std::string, std::pair<Bytes, std::string>> seen_;
  int differences_ = 0;
};

inline Bytes read(const void* p, std::size_t bytes) { return testing::to_host(p, bytes); }

/// One rank's sweep of one operation over `batches`: for each batch, eager, then from a graph
/// captured once and replayed for every placement; `write(rows, p)` fills the batch and puts the
/// token rows in place, `check(rows, p, mode)` reads them back after the call.
struct Sweep {
  Group& g;
  Bootstrap& boot;
  const StreamHolder& stream;
  std::function<Status(std::int64_t)> call;
  std::function<void(std::int64_t, int)> write;
  std::function<void(std::int64_t, int, const char*)> check;

  void run(std::span<const std::int64_t> batches) const {
    for (const std::int64_t rows : batches) {
      for (const bool graphed : {false, true}) {
        std::optional<CapturedGraph> graph;
        if (graphed) {
          graph.emplace(g, stream.stream(),
                        [&] { EXPECT_EQ(call(rows), Status::kOk) << g.last_error(); });
          ASSERT_TRUE(graph->ok());
        }
        for (int p = 0; p < kPlacements; ++p) {
          write(rows, p);
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          boot.barrier();  // NOTE [graphs of virtual ranks]
          if (graph) {
            ASSERT_EQ(graph->launch(), cudaSuccess);
          } else {
            ASSERT_EQ(call(rows), Status::kOk) << g.last_error();
          }
          ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
          ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
          check(rows, p, graphed ? "graph" : "eager");
        }
      }
    }
  }
};

/// Copies token `k`'s row `src` into row `at` of `dst` on the stream.
inline void put_row(const StreamHolder& s, DeviceBuffer& dst, std::int64_t at,
                    const std::vector<std::uint16_t>& src) {
  const std::size_t bytes = src.size() * 2;
  ASSERT_EQ(cudaMemcpyAsync(dst.bytes_ptr() + at * static_cast<std::int64_t>(bytes), src.data(),
                            bytes, cudaMemcpyHostToDevice, s.get()),
            cudaSuccess);
}

/// Fills `count` elements of `b` with rank `rank`'s filler (other rows), seeded by the batch.
inline void fill(const StreamHolder& s, DeviceBuffer& b, DType t, std::int64_t count,
                 std::uint64_t seed, int rank) {
  ASSERT_EQ(kernels::fill_data(b.get(), t, count, seed, rank, ReduceOp::kSum, 0, s.stream()),
            Status::kOk);
}

inline bool wide(int world) { return world == 2 || world == 8; }

inline std::span<const std::int64_t> batches_for(int world) {
  return wide(world) ? std::span<const std::int64_t>(kAllBatches)
                     : std::span<const std::int64_t>(kFewBatches);
}

/// "auto" and every algorithm of the registry (only those that fuse, for the fused calls).
inline std::vector<std::string> algorithms(bool fused) {
  std::vector<std::string> names{"auto"};
  for (const AlgoInfo& a : kAlgorithms)
    if (!fused || kernels::fuses(a.kernel)) names.emplace_back(a.name);
  return names;
}

/// The largest batch, 2048 rows of 8192 16-bit elements, fits the staging buffer.
inline Options invariance_options(const std::string& algo) {
  Options o = options_for(algo, kMaxBytes);
  o.lamport_max_bytes = std::int64_t{4} << 20;
  return o;
}

inline GroupConfig deterministic() {
  GroupConfig c;
  c.deterministic = Determinism::kOn;
  return c;
}

}  // namespace tpcomm::testing
