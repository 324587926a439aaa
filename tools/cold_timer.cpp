// SPDX-License-Identifier: Apache-2.0
#include "tools/cold_timer.hpp"

#include <algorithm>

#include "core/cuda_check.hpp"

namespace tpcomm::tools {

ColdTimer::ColdTimer(Stream stream, int device, int ranks_on_gpu, int ops)
    : stream_(reinterpret_cast<cudaStream_t>(stream)) {
  int l2 = 0;
  TPCOMM_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  // Twice the cache between the ranks that share it, and never less than 1 MiB a rank.
  flush_bytes_ = std::max<std::size_t>(
      std::size_t{2} * static_cast<std::size_t>(l2) / static_cast<std::size_t>(ranks_on_gpu),
      std::size_t{1} << 20);
  TPCOMM_CUDA_CHECK(cudaMalloc(&flush_, flush_bytes_));
  start_.resize(static_cast<std::size_t>(ops), nullptr);
  stop_.resize(static_cast<std::size_t>(ops), nullptr);
  for (auto* v : {&start_, &stop_})
    for (cudaEvent_t& e : *v) TPCOMM_CUDA_CHECK(cudaEventCreate(&e));
}

ColdTimer::~ColdTimer() {
  for (auto* v : {&start_, &stop_})
    for (cudaEvent_t e : *v)
      if (e != nullptr) cudaEventDestroy(e);
  cudaFree(flush_);
}

namespace {

/// Records `event` on `stream`. External: in a capture, an event node of the graph (a plain
/// record would only order the capture's streams and never be recorded). Empty, or what failed.
std::string mark(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal);
      e != cudaSuccess)
    return std::string("cudaEventRecord: ") + cudaGetErrorString(e);
  return {};
}

}  // namespace

std::string ColdTimer::before(int i) {
  if (cudaError_t e = cudaMemsetAsync(flush_, i & 0xFF, flush_bytes_, stream_); e != cudaSuccess)
    return std::string("evicting the cache: ") + cudaGetErrorString(e);
  return mark(start_.at(static_cast<std::size_t>(i)), stream_);
}

std::string ColdTimer::after(int i) { return mark(stop_.at(static_cast<std::size_t>(i)), stream_); }

double ColdTimer::mean_us() const {
  double sum = 0;
  for (std::size_t i = 0; i < start_.size(); ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_[i], stop_[i]) != cudaSuccess) return -1;
    sum += static_cast<double>(ms) * 1000.0;
  }
  return start_.empty() ? 0 : sum / static_cast<double>(start_.size());
}

}  // namespace tpcomm::tools
