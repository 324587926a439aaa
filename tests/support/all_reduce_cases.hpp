// SPDX-License-Identifier: Apache-2.0
// Exact all-reduce cases through a Group on virtual ranks, shared by the gpu tests: fresh seeds,
// options, filling, poisoning, reducing and counting wrong elements.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm::testing {

inline std::uint64_t fresh_seed() {
  static std::mt19937_64 rng(std::random_device{}());
  static std::mutex m;
  std::lock_guard lock(m);
  return rng();
}

inline Options options_for(const std::string& algo, std::int64_t max_bytes = 8 << 20) {
  Options o;
  o.algo = algo;
  o.custom_ar_max_bytes = max_bytes;
  o.timeout_ms = 10000;
  return o;
}

/// Copies `bytes` of device memory to the host.
inline std::vector<unsigned char> to_host(const void* p, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

/// Elements of `out` (`count` of `dtype`) that differ bitwise from the all-reduce of
/// `fill_data(seed)` inputs over `world` ranks, counted into `counter` (device memory the caller
/// owns: allocating here could wait for a peer's spinning kernel). Waits for `s`.
inline unsigned long long wrong_elements(DeviceBuffer& counter, const void* out, DType dtype,
                                         std::int64_t count, std::uint64_t seed, int rank,
                                         int world, Stream s) {
  auto* wrong = static_cast<unsigned long long*>(counter.get());
  const auto cs = reinterpret_cast<cudaStream_t>(s);
  unsigned long long bad = 0;
  if (cudaMemsetAsync(wrong, 0, sizeof(bad), cs) != cudaSuccess ||
      kernels::check_data(out, dtype, count, seed, rank, world, ReduceOp::kSum,
                          kernels::Collective::kAllReduce, 0, wrong, s) != Status::kOk ||
      cudaStreamSynchronize(cs) != cudaSuccess ||
      cudaMemcpy(&bad, wrong, sizeof(bad), cudaMemcpyDeviceToHost) != cudaSuccess) {
    ADD_FAILURE() << "counting wrong elements failed";
    return ~0ull;
  }
  return bad;
}

/// One exact all-reduce on every rank: fill, poison, reduce, check. Offsets (in elements)
/// misalign the views; `in_place` reduces `in` into itself. Returns each rank's output bytes
/// through `outputs` for the cross-rank comparison.
struct Case {
  std::int64_t count;
  DType dtype;
  std::int64_t in_offset = 0;
  std::int64_t out_offset = 0;
  bool in_place = false;
};

inline void run_case(Group& g, int rank, const Case& c, std::uint64_t seed, Stream s,
                     std::vector<std::vector<unsigned char>>& outputs, std::mutex& m) {
  const std::size_t esize = dtype_size(c.dtype);
  DeviceBuffer in_buf((c.count + c.in_offset + 8) * esize);
  DeviceBuffer out_buf((c.count + c.out_offset + 8) * esize);
  DeviceBuffer wrong(sizeof(unsigned long long));
  void* in = in_buf.bytes_ptr() + c.in_offset * esize;
  void* out = c.in_place ? in : out_buf.bytes_ptr() + c.out_offset * esize;
  ASSERT_EQ(kernels::poison(out_buf.get(), static_cast<std::int64_t>(out_buf.size()), s),
            Status::kOk);
  ASSERT_EQ(kernels::fill_data(in, c.dtype, c.count, seed, rank, ReduceOp::kSum, 0, s),
            Status::kOk);
  auto in_view = TensorView::flat(in, c.dtype, c.count, 0);
  auto out_view = TensorView::flat(out, c.dtype, c.count, 0);
  ASSERT_EQ(g.all_reduce(in_view, out_view, s), Status::kOk) << g.last_error();
  const unsigned long long bad =
      wrong_elements(wrong, out, c.dtype, c.count, seed, rank, g.world_size(), s);
  ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
  EXPECT_EQ(bad, 0u) << "rank " << rank << " count " << c.count << " " << to_string(c.dtype)
                     << " in+" << c.in_offset << " out+" << c.out_offset
                     << (c.in_place ? " in place" : "");
  auto bytes = to_host(out, static_cast<std::size_t>(c.count) * esize);
  std::lock_guard lock(m);
  outputs[static_cast<std::size_t>(rank)] = std::move(bytes);
}

inline void expect_identical(const std::vector<std::vector<unsigned char>>& outputs,
                             const char* what) {
  for (std::size_t r = 1; r < outputs.size(); ++r)
    EXPECT_TRUE(outputs[r] == outputs[0]) << what << ": rank " << r << " differs from rank 0";
}

}  // namespace tpcomm::testing
