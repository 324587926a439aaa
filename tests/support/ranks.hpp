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
#include "tpcomm/group.hpp"
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

/// A CUDA graph of what `enqueue()` launches on `stream`, captured (thread-local mode) inside a
/// capture scope of `g`, then instantiated and uploaded; destroyed with the scope. A step that
/// fails is a test failure (and `ok()` false where nothing can be launched). Before its first
/// launch every rank sharing the GPU must have uploaded its graph (NOTE [graphs of virtual ranks]
/// in tune/graph_timer.hpp): synchronise the stream and meet at a barrier.
class CapturedGraph {
 public:
  template <class F>
  CapturedGraph(Group& g, Stream stream, F&& enqueue)
      : stream_(reinterpret_cast<cudaStream_t>(stream)) {
    make(g, stream, enqueue);
  }
  ~CapturedGraph() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  [[nodiscard]] bool ok() const { return exec_ != nullptr; }
  /// One replay on the stream it was captured on.
  [[nodiscard]] cudaError_t launch() const { return cudaGraphLaunch(exec_, stream_); }

 private:
  template <class F>
  void make(Group& g, Stream stream, F& enqueue) {
    {
      auto scope = g.capture(stream);
      ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      enqueue();
      ASSERT_EQ(cudaStreamEndCapture(stream_, &graph_), cudaSuccess);
      ASSERT_EQ(scope.close(), Status::kOk) << g.last_error();
    }
    ASSERT_EQ(cudaGraphInstantiate(&exec_, graph_, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphUpload(exec_, stream_), cudaSuccess);
  }

  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

#define TPCOMM_EXPECT_CUDA(expr) EXPECT_EQ((expr), cudaSuccess) << #expr
#define TPCOMM_ASSERT_OK(expr) ASSERT_EQ((expr), ::tpcomm::Status::kOk) << #expr

}  // namespace tpcomm::testing
