// SPDX-License-Identifier: Apache-2.0
// The bench's --json report: write failures are reported, never taken for success.
#include "tools/json_file.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tpcomm::tools {
namespace {

namespace fs = std::filesystem;

TEST(JsonFile, WritesTheDocument) {
  std::string tmpl = (fs::temp_directory_path() / "tpcomm-json-test-XXXXXX").string();
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  const fs::path path = fs::path(tmpl) / "report.json";
  const nlohmann::json doc{{"wrong", 0}, {"rows", nlohmann::json::array()}};
  EXPECT_EQ(write_json_file(path.string(), doc), "");
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), doc.dump(2) + "\n");
  fs::remove_all(tmpl);
}

TEST(JsonFile, ReportsAFullDisk) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no /dev/full";
  const std::string why = write_json_file("/dev/full", nlohmann::json{{"rows", "x"}});
  EXPECT_NE(why.find("cannot write"), std::string::npos) << why;
  EXPECT_NE(why.find("No space left on device"), std::string::npos) << why;
}

TEST(JsonFile, ReportsAPathThatCannotBeOpened) {
  const std::string why =
      write_json_file("/nonexistent-tpcomm-dir/report.json", nlohmann::json::object());
  EXPECT_NE(why.find("cannot open"), std::string::npos) << why;
  EXPECT_NE(why.find("No such file or directory"), std::string::npos) << why;
}

}  // namespace
}  // namespace tpcomm::tools
