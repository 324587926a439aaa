// SPDX-License-Identifier: Apache-2.0
// `tpcomm info` runs anywhere: it exits 0 and reports the driver, even where there is none; only
// invalid TPCOMM_* variables make it exit non-zero.
#include <gtest/gtest.h>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>

#include "support/run_program.hpp"

namespace tpcomm {
namespace {

TEST(InfoCommand, PrintsTheDriverLineAndExitsZero) {
  const auto r = test::run_program(std::string(TPCOMM_CLI_PATH) + " info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nCUDA driver: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nNCCL: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nbackends\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TPCOMM_TIMEOUT_MS"), std::string::npos) << r.output;
  // Every knob line is "  NAME  value": the longest name still stands apart from its value.
  EXPECT_NE(r.output.find("\n  TPCOMM_CUSTOM_AR_REGISTER_BYTES  2 MiB\n"), std::string::npos)
      << r.output;
}

TEST(InfoCommand, JsonHasEverySection) {
  const auto r = test::run_program(std::string(TPCOMM_CLI_PATH) + " info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("tpcomm").at("version"), TPCOMM_VERSION);
  EXPECT_TRUE(j.at("driver").at("available").is_boolean());
  if (!j["driver"]["available"]) {
    EXPECT_FALSE(j["driver"].at("reason").get<std::string>().empty());
    EXPECT_TRUE(j.at("gpus").empty());
  }
  EXPECT_TRUE(j.at("gpus").is_array());
  EXPECT_TRUE(j.at("peers").is_array());
  EXPECT_TRUE(j.at("nvml").at("available").is_boolean());
  EXPECT_TRUE(j.at("nccl").at("available").is_boolean());
  EXPECT_TRUE(j.at("backends").at("nccl").at("usable").is_boolean());
  EXPECT_TRUE(j.at("backends").at("custom_ar").at("usable").is_boolean());
  EXPECT_TRUE(j.at("knobs").at("TPCOMM_NCCL_PATH").is_string());
}

TEST(InfoCommand, NeverPrintsTheStoreToken) {
  const auto r = test::run_program("TPCOMM_STORE_TOKEN=s3cr3t-token " +
                                   std::string(TPCOMM_CLI_PATH) + " info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("s3cr3t-token"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(r.output)["knobs"]["TPCOMM_STORE_TOKEN"], "(set)");
  EXPECT_EQ(nlohmann::json::parse(r.output)["knobs"]["TPCOMM_STORE_TOKEN_FILE"], "(unset)");
}

// The token file is listed by its path; its contents are never printed.
TEST(InfoCommand, ListsTheStoreTokenFileByItsPath) {
  char path[] = "/tmp/tpcomm-info-token-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "s3cr3t-file-token\n", 18), 18);
  ::close(fd);
  const auto r = test::run_program("TPCOMM_STORE_TOKEN_FILE=" + std::string(path) + " " +
                                   std::string(TPCOMM_CLI_PATH) + " info --json");
  ::unlink(path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("s3cr3t-file-token"), std::string::npos);
  const auto knobs = nlohmann::json::parse(r.output)["knobs"];
  EXPECT_EQ(knobs["TPCOMM_STORE_TOKEN_FILE"], path);
  EXPECT_EQ(knobs["TPCOMM_STORE_TOKEN"], "(unset)");
}

// Every invalid variable is listed, the rest of the report is still printed, and the exit code
// says that the environment is not usable.
TEST(InfoCommand, ListsEveryInvalidKnobAndExitsNonZero) {
  const std::string env = "TPCOMM_TIMEOUT_MS=soon TPCOMM_LOG=loud TPCOMM_PDL=maybe ";
  const auto r = test::run_program(env + std::string(TPCOMM_CLI_PATH) + " info");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("TPCOMM_TIMEOUT_MS=\"soon\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TPCOMM_LOG=\"loud\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TPCOMM_PDL=\"maybe\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TPCOMM_NCCL_PATH"), std::string::npos) << r.output;  // the report

  const auto j = test::run_program(env + std::string(TPCOMM_CLI_PATH) + " info --json");
  EXPECT_NE(j.exit_code, 0) << j.output;
  const auto parsed = nlohmann::json::parse(j.output);
  EXPECT_EQ(parsed.at("knobs_errors").size(), 3u) << j.output;
}

TEST(InfoCommand, ValidKnobsExitZero) {
  const auto r =
      test::run_program("TPCOMM_TIMEOUT_MS=1500 " + std::string(TPCOMM_CLI_PATH) + " info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("invalid:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tpcomm
