// SPDX-License-Identifier: Apache-2.0
// Ranks that share a process with the caller's own kernels between the collectives (NOTE [first
// launch] in backends/custom_ar.cpp): every algorithm at 2, 3, 4 and 8 virtual ranks, PDL on and
// off, eager and graph-replayed, checked against a host reference; and a caller kernel left cold,
// which must end in a clear error within the deadline, never in a silent hang.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "gpu/caller_kernels.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::run_ranks;
using testing::StreamHolder;

/// The hidden states of a decode step: tokens x hidden, bf16.
struct Shape {
  std::int64_t tokens;
  std::int64_t hidden;
  [[nodiscard]] std::int64_t numel() const { return tokens * hidden; }
};

std::vector<Shape> decode_shapes() {
  std::vector<Shape> out;
  for (std::int64_t t : {1, 2, 3, 8, 17, 128})
    for (std::int64_t h : {1, 7, 128, 2880, 4096, 7168}) out.push_back({t, h});
  return out;
}

/// Rank `rank`'s element `i` of pair `pair`: a small integer, so every sum the test forms (up to
/// 8 ranks plus a residual) is exact in bf16 whatever the order. Rank -1 is the residual.
int value(std::uint64_t seed, int rank, int pair, std::int64_t i) {
  std::uint64_t h = seed ^ (static_cast<std::uint64_t>(rank + 1) * 0x9E3779B97F4A7C15ull) ^
                    (static_cast<std::uint64_t>(pair) * 0xC2B2AE3D27D4EB4Full) ^
                    (static_cast<std::uint64_t>(i) * 0x165667B19E3779F9ull);
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return static_cast<int>(h % 9) - 4;
}

std::uint16_t bf16_bits(int v) {
  const float f = static_cast<float>(v);
  std::uint32_t b = 0;
  std::memcpy(&b, &f, sizeof(b));
  return static_cast<std::uint16_t>(b >> 16);
}

/// One rank's side of a sequence of (all-reduce, caller kernel) pairs over `shapes`: pair k
/// all-reduces x_k into sum_k, then the caller's kernel writes out_k = sum_k + residual.
class Pairs {
 public:
  Pairs(std::vector<Shape> shapes, int rank, int world)
      : shapes_(std::move(shapes)), rank_(rank), world_(world) {
    std::int64_t widest = 0;
    for (const Shape& s : shapes_) {
      offsets_.push_back(total_);
      total_ += s.numel();
      widest = std::max(widest, s.numel());
    }
    // Allocated before the first collective: an allocation can wait for a peer's kernel.
    x_ = std::make_unique<DeviceBuffer>(total_ * 2);
    sum_ = std::make_unique<DeviceBuffer>(total_ * 2);
    out_ = std::make_unique<DeviceBuffer>(total_ * 2);
    residual_ = std::make_unique<DeviceBuffer>(widest * 2);
  }

  /// New inputs from `seed` and poisoned outputs, on `s` (the caller synchronises).
  void refill(std::uint64_t seed, cudaStream_t s) {
    host_.resize(static_cast<std::size_t>(total_));
    for (std::size_t k = 0; k < shapes_.size(); ++k)
      for (std::int64_t i = 0; i < shapes_[k].numel(); ++i)
        host_[static_cast<std::size_t>(offsets_[k] + i)] =
            bf16_bits(value(seed, rank_, static_cast<int>(k), i));
    residual_host_.resize(residual_->size() / 2);
    for (std::size_t i = 0; i < residual_host_.size(); ++i)
      residual_host_[i] = bf16_bits(value(seed, -1, 0, static_cast<std::int64_t>(i)));
    ASSERT_EQ(cudaMemcpyAsync(x_->get(), host_.data(), host_.size() * 2, cudaMemcpyHostToDevice, s),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(residual_->get(), residual_host_.data(), residual_host_.size() * 2,
                              cudaMemcpyHostToDevice, s),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(sum_->get(), 0xFF, sum_->size(), s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(out_->get(), 0xFF, out_->size(), s), cudaSuccess);
  }

  /// Enqueues every pair on `s`, the caller's kernel from `add`.
  template <class Add>
  void enqueue(Group& g, cudaStream_t s, Add&& add) {
    for (std::size_t k = 0; k < shapes_.size(); ++k) {
      const std::int64_t n = shapes_[k].numel();
      const auto view = [&](void* base) {
        return TensorView::contiguous(static_cast<char*>(base) + offsets_[k] * 2, DType::kBF16,
                                      {shapes_[k].tokens, shapes_[k].hidden}, 0);
      };
      ASSERT_EQ(g.all_reduce(view(x_->get()), view(sum_->get()), reinterpret_cast<Stream>(s)),
                Status::kOk)
          << g.last_error();
      ASSERT_EQ(add(sum_->bytes_ptr() + offsets_[k] * 2, residual_->get(),
                    out_->bytes_ptr() + offsets_[k] * 2, n, s),
                cudaSuccess);
    }
  }

  /// Elements of the all-reduce outputs and of the caller's outputs that differ bitwise from
  /// the host reference for inputs from `seed`.
  std::int64_t wrong(std::uint64_t seed) const {
    std::vector<std::uint16_t> sum(static_cast<std::size_t>(total_)), out(sum.size());
    EXPECT_EQ(cudaMemcpy(sum.data(), sum_->get(), sum.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), out_->get(), out.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    std::int64_t bad = 0;
    for (std::size_t k = 0; k < shapes_.size(); ++k) {
      for (std::int64_t i = 0; i < shapes_[k].numel(); ++i) {
        int expected = 0;
        for (int r = 0; r < world_; ++r) expected += value(seed, r, static_cast<int>(k), i);
        const auto at = static_cast<std::size_t>(offsets_[k] + i);
        bad += sum[at] != bf16_bits(expected) ? 1 : 0;
        bad += out[at] != bf16_bits(expected + value(seed, -1, 0, i)) ? 1 : 0;
      }
    }
    return bad;
  }

 private:
  std::vector<Shape> shapes_;
  int rank_;
  int world_;
  std::vector<std::int64_t> offsets_;
  std::int64_t total_ = 0;
  std::unique_ptr<DeviceBuffer> x_, sum_, out_, residual_;
  std::vector<std::uint16_t> host_, residual_host_;
};

class CallerKernels : public ::testing::TestWithParam<std::tuple<int, std::string, bool>> {};

// The README's rule: each of the caller's kernels launched once on the stream before the first
// collective there. Then pairs back to back with no host synchronisation, eagerly and as a
// graph replayed with new inputs.
TEST_P(CallerKernels, BetweenCollectivesWarmedUpAsTheReadmeSays) {
  const auto [world, algo, programmatic] = GetParam();
  const std::uint64_t seed = fresh_seed();
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o;
    o.algo = algo;
    o.programmatic_launch = programmatic;
    o.timeout_ms = 5000;
    Group g(boot, 0, o);
    StreamHolder stream;
    const cudaStream_t s = stream.get();
    Pairs pairs(decode_shapes(), rank, world);
    ASSERT_EQ(testing::add_residual(nullptr, nullptr, nullptr, 0, s), cudaSuccess);
    ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();

    pairs.refill(seed, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    boot.barrier();
    pairs.enqueue(g, s, testing::add_residual);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
    EXPECT_EQ(pairs.wrong(seed), 0) << "eager, rank " << rank;

    {
      const testing::CapturedGraph graph(g, stream.stream(),
                                         [&] { pairs.enqueue(g, s, testing::add_residual); });
      ASSERT_TRUE(graph.ok());
      for (int replay = 0; replay < 2; ++replay) {
        const std::uint64_t replay_seed = seed + 1 + static_cast<std::uint64_t>(replay);
        pairs.refill(replay_seed, s);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        boot.barrier();  // every rank's graph uploaded, every input in place
        ASSERT_EQ(graph.launch(), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
        EXPECT_EQ(pairs.wrong(replay_seed), 0) << "graph replay " << replay << ", rank " << rank;
      }
      boot.barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, CallerKernels,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::Values("auto", "one_shot", "two_shot",
                                                              "lamport", "lamport_two_shot"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param) +
                                  (std::get<2>(info.param) ? "_pdl" : "_plain_launch");
                         });

// A caller kernel launched for the first time between collectives may hold its rank's stream
// until the peers give up (NOTE [first launch]). Whichever way a run goes, it must end within
// the deadline: exact results, or kTimeout on every rank with a message that says a rank never
// started the operation and names the rule.
TEST(CallerKernels, ColdKernelEndsInAClearErrorNotAHang) {
  const int world = 8;
  const std::uint64_t seed = fresh_seed();
  const std::int64_t timeout_ms = 2000;
  std::mutex m;
  std::vector<std::string> errors;
  int healthy = 0;
  const auto start = std::chrono::steady_clock::now();
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    Options o;
    o.timeout_ms = timeout_ms;
    Group g(boot, 0, o);
    StreamHolder stream;
    const cudaStream_t s = stream.get();
    Pairs pairs(decode_shapes(), rank, world);
    ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
    pairs.refill(seed, s);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    boot.barrier();
    pairs.enqueue(g, s, testing::add_residual_cold);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const Status h = g.health();
    std::lock_guard lock(m);
    if (h == Status::kOk) {
      ++healthy;
      EXPECT_EQ(pairs.wrong(seed), 0) << "rank " << rank;
    } else {
      EXPECT_EQ(h, Status::kTimeout) << g.last_error();
      errors.push_back(g.last_error());
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Group setup, the checks, and at most a few deadlines in a row (operations queued behind a
  // failed one drain at once).
  EXPECT_LT(seconds, 5.0 * static_cast<double>(timeout_ms) / 1000.0 + 10.0);
  if (errors.empty()) {
    EXPECT_EQ(healthy, world);
    return;
  }
  bool named = false;
  for (const std::string& e : errors)
    named = named || (e.find("had not started") != std::string::npos &&
                      e.find("Ranks that share a process") != std::string::npos);
  EXPECT_TRUE(named) << "no rank's error names a peer that never started: " << errors[0];
  std::printf("cold caller kernel: %zu of %d ranks timed out, e.g. %s\n", errors.size(), world,
              errors[0].c_str());
}

}  // namespace
}  // namespace tpcomm
