// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench --cold`: each operation timed alone, after the L2 cache was evicted.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tpcomm/types.hpp"

namespace tpcomm::tools {

/// Marks around each of `ops` operations on one rank's stream, each after a write of a buffer
/// larger than the L2 cache, so that the operation finds none of its data there (as a decode
/// step's call does after the GEMMs before it). Eager or captured alike: in a CUDA graph the
/// marks are event nodes, read after each replay. Not thread-safe; one per rank.
class ColdTimer {
 public:
  /// `ranks_on_gpu`: how many ranks share this rank's GPU and its L2; each writes its share of
  /// twice the cache.
  ColdTimer(Stream stream, int device, int ranks_on_gpu, int ops);
  ~ColdTimer();
  ColdTimer(const ColdTimer&) = delete;
  ColdTimer& operator=(const ColdTimer&) = delete;

  /// Enqueues the eviction, then the start mark of operation `i`. Empty, or what failed.
  std::string before(int i);
  /// Enqueues the end mark of operation `i`. Empty, or what failed.
  std::string after(int i);
  /// The mean time of the operations between the marks, in microseconds, once the stream has
  /// passed them; negative if a mark cannot be read.
  [[nodiscard]] double mean_us() const;

 private:
  cudaStream_t stream_;
  void* flush_ = nullptr;
  std::size_t flush_bytes_ = 0;
  std::vector<cudaEvent_t> start_;
  std::vector<cudaEvent_t> stop_;
};

}  // namespace tpcomm::tools
