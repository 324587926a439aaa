// SPDX-License-Identifier: Apache-2.0
// `tpcomm info` runs anywhere: it exits 0 and reports the driver, even where there is none; only
// invalid TPCOMM_* variables make it exit non-zero.
#include <gtest/gtest.h>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "support/run_program.hpp"
#include "tpcomm/options.hpp"

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

// The knobs `tpcomm info` lists are `knob_names()`, in its order, each with a value; and that
// list is every TPCOMM_* variable the library reads: each name read in src/policy/options.cpp
// (`getenv`, `count`, `flag`) and each read with getenv anywhere else in src/.
TEST(InfoCommand, ListsEveryKnobTheLibraryReads) {
  const auto r = test::run_program(std::string(TPCOMM_CLI_PATH) + " info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::ordered_json knobs = nlohmann::ordered_json::parse(r.output).at("knobs");
  std::vector<std::string> listed;
  for (const auto& [name, value] : knobs.items()) {
    listed.push_back(name);
    EXPECT_NE(value, "(not shown)") << name;
  }
  std::vector<std::string> names;
  for (const std::string_view n : knob_names()) names.emplace_back(n);
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()),
            std::set<std::string>(names.begin(), names.end()));
  EXPECT_EQ(listed.size(), names.size());

  std::set<std::string> read;
  const std::regex reads(R"re(\b(getenv|count|flag)\("(TPCOMM_[A-Z0-9_]+)")re");
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(std::string(TPCOMM_SOURCE_DIR) + "/src")) {
    if (!entry.is_regular_file()) continue;
    const std::string path = entry.path().string();
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const bool options = path.ends_with("src/policy/options.cpp");
    for (auto m = std::sregex_iterator(text.begin(), text.end(), reads);
         m != std::sregex_iterator(); ++m) {
      if (options || (*m)[1] == "getenv") read.insert((*m)[2]);
    }
  }
  EXPECT_GE(read.size(), 20u);
  EXPECT_EQ(read, std::set<std::string>(names.begin(), names.end()));
}

// The workspace the fusion knobs give, and the peer memory it costs each rank.
TEST(InfoCommand, ShowsTheLamportWorkspaceAndItsMemoryPerRank) {
  const auto r = test::run_program("TPCOMM_FUSION_MAX_TOKENS=1024 TPCOMM_FUSION_HIDDEN=8192 " +
                                   std::string(TPCOMM_CLI_PATH) + " info --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lamport = nlohmann::json::parse(r.output).at("lamport_workspace");
  ASSERT_EQ(lamport.size(), 3u) << lamport;
  EXPECT_EQ(lamport[0].at("world_size"), 2);
  EXPECT_EQ(lamport[0].at("slot_bytes"), std::int64_t{16} << 20);
  EXPECT_EQ(lamport[0].at("bytes_per_rank"), std::int64_t{96} << 20);
  const auto text = test::run_program("TPCOMM_FUSION_MAX_TOKENS=1024 TPCOMM_FUSION_HIDDEN=8192 " +
                                      std::string(TPCOMM_CLI_PATH) + " info");
  EXPECT_NE(text.output.find("2 ranks: slot 16 MiB, 96 MiB of peer memory"), std::string::npos)
      << text.output;
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
