// SPDX-License-Identifier: Apache-2.0
// The lazily loaded driver table against the real driver.
#include "core/cuda_driver.hpp"

#include <gtest/gtest.h>

#include <string>

namespace tpcomm {
namespace {

TEST(CudaDriverOnGpu, ResolvesAndSeesTheDevices) {
  const CudaDriver& drv = CudaDriver::get();
  int version = 0;
  ASSERT_EQ(drv.cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_GT(version, 0);
  int count = 0;
  ASSERT_EQ(drv.cuDeviceGetCount(&count), CUDA_SUCCESS);
  ASSERT_GE(count, 1);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    ASSERT_EQ(drv.cuDeviceGet(&dev, i), CUDA_SUCCESS);
    char name[256] = {};
    ASSERT_EQ(drv.cuDeviceGetName(name, sizeof(name), dev), CUDA_SUCCESS);
    EXPECT_FALSE(std::string(name).empty()) << "device " << i;
    std::size_t bytes = 0;
    ASSERT_EQ(drv.cuDeviceTotalMem(&bytes, dev), CUDA_SUCCESS);
    EXPECT_GT(bytes, 0u) << "device " << i;
  }
  EXPECT_EQ(drv.error_string(CUDA_ERROR_INVALID_VALUE).rfind("CUDA_ERROR_INVALID_VALUE: ", 0), 0u);
}

}  // namespace
}  // namespace tpcomm
