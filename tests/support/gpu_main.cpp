// SPDX-License-Identifier: Apache-2.0
// main() of the gpu tier: exits 77 (CTest's "skipped") where there is no CUDA device, so the
// tier never passes silently on a machine that cannot run it. Listing tests needs no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "core/shared_gpu.hpp"

int main(int argc, char** argv) {
  tpcomm::set_shared_gpu_environment();  // the tests run virtual ranks
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
