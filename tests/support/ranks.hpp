// SPDX-License-Identifier: Apache-2.0
// Virtual ranks for GPU tests: one thread per rank, all on GPU 0, bootstraps sharing one
// in-process store.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/test_data.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::testing {

/// Runs `body(rank, bootstrap)` on `world` threads with CUDA device 0 current, and rethrows
/// the first exception any of them raised. gtest assertions inside `body` are thread-safe.
inline void run_ranks(int world, const std::function<void(int, Bootstrap&)>& body,
                      Milliseconds timeout = Milliseconds{20000}) {
  auto boots = Bootstrap::in_process(world, timeout);
  std::vector<std::thread> threads;
  std::mutex m;
  std::exception_ptr first;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice(0) failed");
        body(r, boots[static_cast<std::size_t>(r)]);
      } catch (...) {
        std::lock_guard lock(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

/// A device allocation that frees itself.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) throw std::bad_alloc();
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  [[nodiscard]] void* get() const { return ptr_; }
  [[nodiscard]] char* bytes_ptr() const { return static_cast<char*>(ptr_); }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

/// A stream that is destroyed with the scope. The test-data kernels are launched on it once when
/// it is made, as callers launch their own kernels before a stream's first collective (NOTE
/// [first launch] in backends/custom_ar.cpp): a test that launches them between collectives
/// needs no warm-up of its own.
class StreamHolder {
 public:
  StreamHolder() {
    cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
    (void)kernels::warm_up_test_data(stream());
    cudaStreamSynchronize(s_);
  }
  ~StreamHolder() { cudaStreamDestroy(s_); }
  StreamHolder(const StreamHolder&) = delete;
  StreamHolder& operator=(const StreamHolder&) = delete;
  [[nodiscard]] cudaStream_t get() const { return s_; }
  [[nodiscard]] Stream stream() const { return reinterpret_cast<Stream>(s_); }

 private:
  cudaStream_t s_ = nullptr;
};

#define TPCOMM_EXPECT_CUDA(expr) EXPECT_EQ((expr), cudaSuccess) << #expr
#define TPCOMM_ASSERT_OK(expr) ASSERT_EQ((expr), ::tpcomm::Status::kOk) << #expr

}  // namespace tpcomm::testing
