// SPDX-License-Identifier: Apache-2.0
#include "tune/graph_timer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace tpcomm {

struct GraphTimer::Impl {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

GraphTimer::GraphTimer(Stream stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = reinterpret_cast<cudaStream_t>(stream);
}

GraphTimer::~GraphTimer() { reset(); }

void GraphTimer::reset() noexcept {
  if (impl_->exec != nullptr) cudaGraphExecDestroy(impl_->exec);
  if (impl_->graph != nullptr) cudaGraphDestroy(impl_->graph);
  impl_->exec = nullptr;
  impl_->graph = nullptr;
}

std::string GraphTimer::capture(const std::function<std::string()>& enqueue) {
  reset();
  Impl& m = *impl_;
  if (cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
    return "cudaStreamBeginCapture failed";
  std::string failure = enqueue();
  const cudaError_t ended = cudaStreamEndCapture(m.stream, &m.graph);
  if (!failure.empty()) return failure;
  if (ended != cudaSuccess)
    return std::string("graph capture failed: ") + cudaGetErrorString(ended);
  if (cudaError_t e = cudaGraphInstantiate(&m.exec, m.graph, 0); e != cudaSuccess)
    return std::string("instantiating the graph failed: ") + cudaGetErrorString(e);
  if (cudaError_t e = cudaGraphUpload(m.exec, m.stream); e != cudaSuccess)
    return std::string("uploading the graph failed: ") + cudaGetErrorString(e);
  if (cudaError_t e = cudaStreamSynchronize(m.stream); e != cudaSuccess)
    return std::string("uploading the graph failed: ") + cudaGetErrorString(e);
  return {};
}

std::string GraphTimer::replay() {
  if (impl_->exec == nullptr) return "no graph captured";
  const cudaError_t e = cudaGraphLaunch(impl_->exec, impl_->stream);
  return e == cudaSuccess ? std::string() : std::string("graph launch: ") + cudaGetErrorString(e);
}

std::string GraphTimer::time(Bootstrap& boot, int replays, double* us, int warmup) {
  Impl& m = *impl_;
  *us = 0;
  boot.barrier();  // every rank's graph uploaded
  for (int w = 0; w < std::max(warmup, 1); ++w)
    if (std::string f = replay(); !f.empty()) return f;
  if (cudaError_t e = cudaStreamSynchronize(m.stream); e != cudaSuccess)
    return cudaGetErrorString(e);
  std::vector<cudaEvent_t> events(static_cast<std::size_t>(std::max(replays, 1)) + 1, nullptr);
  std::string failure;
  for (auto& e : events)
    if (cudaEventCreate(&e) != cudaSuccess) failure = "cudaEventCreate failed";
  boot.barrier();  // replays of all ranks overlap
  if (failure.empty()) {
    cudaEventRecord(events[0], m.stream);
    for (std::size_t r = 1; r < events.size(); ++r) {
      cudaGraphLaunch(m.exec, m.stream);
      cudaEventRecord(events[r], m.stream);
    }
    if (cudaError_t e = cudaStreamSynchronize(m.stream); e != cudaSuccess)
      failure = cudaGetErrorString(e);
  }
  std::vector<double> each;
  for (std::size_t r = 1; r < events.size() && failure.empty(); ++r) {
    float ms = 0;
    cudaEventElapsedTime(&ms, events[r - 1], events[r]);
    each.push_back(static_cast<double>(ms) * 1000.0);
  }
  for (auto& e : events)
    if (e != nullptr) cudaEventDestroy(e);
  if (!failure.empty()) return failure;
  std::sort(each.begin(), each.end());
  *us = each[each.size() / 2];
  return {};
}

}  // namespace tpcomm
