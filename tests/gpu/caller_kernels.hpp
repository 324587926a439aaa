// SPDX-License-Identifier: Apache-2.0
// Kernels of "the caller": compiled into the test program with its own CUDA runtime, the way an
// engine's kernels sit next to tpcomm. Host-only declarations.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tpcomm::testing {

/// out[i] = sum[i] + residual[i] over `count` bf16 elements (16-bit patterns), on `stream`: the
/// residual add an engine runs after a row-parallel layer's all-reduce. `count` 0 launches it
/// with nothing to do (the warm-up the README asks for).
cudaError_t add_residual(const void* sum, const void* residual, void* out, std::int64_t count,
                         cudaStream_t stream);

/// The same arithmetic in a kernel of its own that no test launches beforehand.
cudaError_t add_residual_cold(const void* sum, const void* residual, void* out, std::int64_t count,
                              cudaStream_t stream);

}  // namespace tpcomm::testing
