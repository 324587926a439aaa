// SPDX-License-Identifier: Apache-2.0
// main() of the gpu tier: exits 77 (CTest's "skipped") where there is no CUDA device, so the
// tier never passes silently on a machine that cannot run it. Listing tests needs no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  // Virtual ranks spin on one GPU waiting for each other; a kernel loaded lazily on its first
  // launch can wait for the device to go idle meanwhile. Load every kernel up front. And give
  // every rank's stream a hardware queue of its own: two streams sharing one are dispatched in
  // submission order, so a rank's queued kernels can block the peer kernel it waits for.
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  testing::InitGoogleTest(&argc, argv);
  if (!GTEST_FLAG_GET(list_tests)) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::fprintf(stderr, "gpu tests skipped: no CUDA device (%s)\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
      return 77;
    }
  }
  return RUN_ALL_TESTS();
}
