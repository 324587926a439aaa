// SPDX-License-Identifier: Apache-2.0
// Checks of CUDA runtime calls (library code that links the runtime only).
#pragma once

#include <cuda_runtime.h>

#include "core/check.hpp"

namespace tpcomm::detail {

/// Throws for CUDA error `e` of call `expr`: `kUnavailable` where the machine has no usable GPU
/// (no driver, one older than the runtime, no device visible), saying so; `kCudaError` else.
[[noreturn]] inline void throw_cuda(const char* file, int line, const char* expr, cudaError_t e) {
  const char* no_gpu = e == cudaErrorInsufficientDriver
                           ? "no usable NVIDIA driver (none is installed, or it is older than the "
                             "CUDA runtime tpcomm was built with)"
                       : e == cudaErrorNoDevice ? "no CUDA GPU is visible to this process"
                                                : nullptr;
  if (no_gpu != nullptr)
    throw_error(Status::kUnavailable, file, line,
                concat(no_gpu, ": ", expr, " failed: ", cudaGetErrorName(e)));
  throw_error(Status::kCudaError, file, line,
              concat(expr, " failed: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

}  // namespace tpcomm::detail

/// Throws `Error(kCudaError)` naming the call and CUDA's error when `expr` fails
/// (`kUnavailable` where there is no usable GPU: `detail::throw_cuda`).
#define TPCOMM_CUDA_CHECK(expr)                                    \
  do {                                                             \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) [[unlikely]]   \
      ::tpcomm::detail::throw_cuda(__FILE__, __LINE__, #expr, e_); \
  } while (0)

/// Returns `Status::kCudaError` from the caller when `expr` fails (hot path).
#define TPCOMM_CUDA_TRY(expr)               \
  do {                                      \
    if ((expr) != cudaSuccess) [[unlikely]] \
      return ::tpcomm::Status::kCudaError;  \
  } while (0)

namespace tpcomm {

/// Makes `device` current for the scope and restores the previous device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TPCOMM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) TPCOMM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace tpcomm
