// SPDX-License-Identifier: Apache-2.0
// `tpcomm info` on a machine with a GPU names it, in text and in JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/cuda_driver.hpp"
#include "support/run_program.hpp"

namespace tpcomm {
namespace {

std::string device_zero_name() {
  const CudaDriver& drv = CudaDriver::get();
  CUdevice dev = 0;
  char name[256] = {};
  EXPECT_EQ(drv.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(drv.cuDeviceGetName(name, sizeof(name), dev), CUDA_SUCCESS);
  return name;
}

TEST(InfoCommandOnGpu, NamesTheGpu) {
  const std::string name = device_zero_name();
  ASSERT_FALSE(name.empty());

  const auto text = test::run_program(test::built_file(TPCOMM_CLI_PATH) + " info");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find(name), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("GPU sections skipped"), std::string::npos) << text.output;

  const auto json = test::run_program(test::built_file(TPCOMM_CLI_PATH) + " info --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j.at("driver").at("available"), true);
  ASSERT_GE(j.at("gpus").size(), 1u);
  EXPECT_EQ(j["gpus"][0].at("name"), name);
  EXPECT_GT(j["gpus"][0].at("sm_count").get<int>(), 0);
  EXPECT_GT(j["gpus"][0].at("memory_bytes").get<std::int64_t>(), 0);
  if (j.at("nccl").at("available") == true) {
    EXPECT_EQ(j.at("backends").at("nccl").at("usable"), true) << j["backends"].dump();
  }
}

}  // namespace
}  // namespace tpcomm
