// SPDX-License-Identifier: Apache-2.0
// The CUDA environment that ranks sharing one GPU need, in one place.
#pragma once

#include <cstdlib>

namespace tpcomm {

/// Ranks that share one GPU (virtual ranks) wait for each other inside kernels, so two things
/// that are harmless elsewhere can stop them forever:
///  - a kernel loaded lazily on its first launch can wait for the device to go idle, which a
///    peer's spinning kernel prevents: load every kernel up front;
///  - two streams that share a hardware queue are dispatched in submission order, so one rank's
///    queued kernels can block the peer kernel another rank waits for: give every stream a
///    queue of its own.
/// Sets both unless the caller's environment already does. Call it before the first CUDA call
/// of the process; later it has no effect.
inline void set_shared_gpu_environment() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
}

}  // namespace tpcomm
