// SPDX-License-Identifier: Apache-2.0
// The CUDA error behind a launcher's kCudaError, kept for the message that reports it (the local
// kernels' launchers: `launch_add_rmsnorm`, `launch_moe_combine`).
#pragma once

#include <cuda_runtime.h>

#include "tpcomm/status.hpp"

namespace tpcomm::kernels {

/// kOk for `cudaSuccess`; otherwise kCudaError, keeping the error's name and text for this
/// thread's `last_launch_error`.
Status launched(cudaError_t error) noexcept;

/// "cudaErrorStreamCaptureInvalidated: operation failed due to a previous error during capture":
/// the error of this thread's last launch that `launched` saw fail; empty if none did.
const char* last_launch_error() noexcept;

}  // namespace tpcomm::kernels
