// SPDX-License-Identifier: Apache-2.0
// Checks of CUDA runtime calls (library code that links the runtime only).
#pragma once

#include <cuda_runtime.h>

#include "core/check.hpp"

/// Throws `Error(kCudaError)` naming the call and CUDA's error when `expr` fails.
#define TPCOMM_CUDA_CHECK(expr)                                                                  \
  do {                                                                                           \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) [[unlikely]]                                 \
      TPCOMM_THROW(::tpcomm::Status::kCudaError, #expr, " failed: ", cudaGetErrorName(e_), ": ", \
                   cudaGetErrorString(e_));                                                      \
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
