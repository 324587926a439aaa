// SPDX-License-Identifier: Apache-2.0
// The CUDA driver API, loaded lazily with dlopen so tpcomm_core loads on machines without a
// driver. Types come from the real prototypes in <cuda.h>; each symbol is named once.
#pragma once

#include <cuda.h>

#include <string>

namespace tpcomm {

// X(name): every driver entry point tpcomm uses. `name` may be a macro of <cuda.h> that
// selects a versioned symbol (cuDeviceTotalMem -> cuDeviceTotalMem_v2); the table resolves
// the versioned name, as a program linked against libcuda would.
#define TPCOMM_CUDA_DRIVER_SYMBOLS(X) \
  X(cuInit)                           \
  X(cuDriverGetVersion)               \
  X(cuGetErrorName)                   \
  X(cuGetErrorString)                 \
  X(cuDeviceGetCount)                 \
  X(cuDeviceGet)                      \
  X(cuDeviceGetName)                  \
  X(cuDeviceGetAttribute)             \
  X(cuDeviceTotalMem)                 \
  X(cuDeviceGetUuid)                  \
  X(cuDeviceGetPCIBusId)              \
  X(cuDeviceCanAccessPeer)            \
  X(cuDeviceGetP2PAttribute)          \
  X(cuMemGetAddressRange)             \
  X(cuPointerGetAttribute)

/// Function table of the driver. Obtain it with `CudaDriver::get()`.
struct CudaDriver {
#define TPCOMM_DECLARE_FN(name) decltype(&::name) name = nullptr;
  TPCOMM_CUDA_DRIVER_SYMBOLS(TPCOMM_DECLARE_FN)
#undef TPCOMM_DECLARE_FN

  /// The process-wide table, loaded and `cuInit(0)`-ed on first use. Throws
  /// `Error(kUnavailable)` when libcuda.so.1 cannot be loaded, a symbol is missing, or cuInit
  /// fails; the message says which (see `try_get`). Thread-safe.
  static const CudaDriver& get();
  /// Like `get()` but returns nullptr and fills `why` instead of throwing. `why` is a short
  /// phrase that reads after "CUDA driver: ": "not found (<dlerror text>)", "too old (lacks
  /// cuX)" or "cuInit failed (CUDA_ERROR_NO_DEVICE: ...)".
  static const CudaDriver* try_get(std::string* why = nullptr) noexcept;

  /// "CUDA_ERROR_X: description" for a driver result.
  [[nodiscard]] std::string error_string(CUresult r) const;
};

}  // namespace tpcomm
