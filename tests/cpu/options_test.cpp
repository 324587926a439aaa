// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/parse.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

Options from(const std::map<std::string, std::string>& env) {
  return Options::from_lookup([&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

TEST(Options, Defaults) {
  Options o = from({});
  EXPECT_EQ(o.log_level, LogLevel::kWarn);
  EXPECT_EQ(o.nccl_path, "libnccl.so.2");
  EXPECT_EQ(o.timeout_ms, 30000);
  EXPECT_EQ(o.algo, "auto");
  EXPECT_EQ(o.custom_ar_max_bytes, 8 << 20);
  EXPECT_EQ(o.custom_ar_register_min_bytes, 2 << 20);
  EXPECT_EQ(o.lamport_max_bytes, 512 << 10);
  EXPECT_FALSE(o.disable_custom_ar);
  EXPECT_FALSE(o.disable_nccl);
  EXPECT_TRUE(o.programmatic_launch);
  EXPECT_EQ(o.lm_head_a2a, Switch::kAuto);
  EXPECT_EQ(o.failure_mode, FailureMode::kRaise);
  EXPECT_TRUE(o.store_token.empty());
  EXPECT_TRUE(o.store_token_file.empty());
}

TEST(Options, ReadsEveryKnob) {
  Options o = from({{"TPCOMM_LOG", "debug"},
                    {"TPCOMM_NCCL_PATH", "/opt/nccl/libnccl.so.2"},
                    {"TPCOMM_TIMEOUT_MS", "1500"},
                    {"TPCOMM_ALGO", "lamport-two-shot"},
                    {"TPCOMM_EXCHANGE_ALGO", "push"},
                    {"TPCOMM_TUNE_FILE", "/tmp/t.txt"},
                    {"TPCOMM_CUSTOM_AR_MAX_BYTES", "16M"},
                    {"TPCOMM_CUSTOM_AR_REGISTER_BYTES", "0"},
                    {"TPCOMM_LAMPORT_MAX_BYTES", "64K"},
                    {"TPCOMM_DISABLE_CUSTOM_AR", "1"},
                    {"TPCOMM_DISABLE_NCCL", "yes"},
                    {"TPCOMM_PDL", "0"},
                    {"TPCOMM_LM_HEAD_A2A", "1"},
                    {"TPCOMM_NCCL_CHECK", "off"},
                    {"TPCOMM_ASYNC_ERROR_HANDLING", "Teardown"},
                    {"TPCOMM_STORE_TOKEN", "s3cret"},
                    {"TPCOMM_STORE_BIND", "0.0.0.0"}});
  EXPECT_EQ(o.log_level, LogLevel::kDebug);
  EXPECT_EQ(o.nccl_check, Switch::kOff);
  EXPECT_EQ(o.nccl_path, "/opt/nccl/libnccl.so.2");
  EXPECT_EQ(o.timeout_ms, 1500);
  EXPECT_EQ(o.algo, "lamport_two_shot");  // canonical spelling
  EXPECT_EQ(o.exchange_algo, "push");
  EXPECT_EQ(o.tune_file, "/tmp/t.txt");
  EXPECT_EQ(o.custom_ar_max_bytes, 16 << 20);
  EXPECT_EQ(o.custom_ar_register_min_bytes, 0);
  EXPECT_EQ(o.lamport_max_bytes, 64 << 10);
  EXPECT_TRUE(o.disable_custom_ar);
  EXPECT_TRUE(o.disable_nccl);
  EXPECT_FALSE(o.programmatic_launch);
  EXPECT_EQ(o.lm_head_a2a, Switch::kOn);
  EXPECT_EQ(o.failure_mode, FailureMode::kTeardown);
  EXPECT_EQ(o.store_token, "s3cret");
  EXPECT_EQ(o.store_bind, "0.0.0.0");
}

TEST(Options, MalformedValuesAreErrorsNamingTheVariable) {
  for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"TPCOMM_LOG", "loud"},
           {"TPCOMM_TIMEOUT_MS", "-5"},
           {"TPCOMM_TIMEOUT_MS", "10s"},
           {"TPCOMM_ALGO", "fastest"},
           {"TPCOMM_EXCHANGE_ALGO", "lamport"},
           {"TPCOMM_CUSTOM_AR_MAX_BYTES", "8X"},
           {"TPCOMM_LAMPORT_MAX_BYTES", "100"},
           {"TPCOMM_DISABLE_NCCL", "maybe"},
           {"TPCOMM_LM_HEAD_A2A", "sometimes"},
           {"TPCOMM_NCCL_CHECK", "sometimes"},
           {"TPCOMM_ASYNC_ERROR_HANDLING", "1"},
           {"TPCOMM_CUSTOM_AR_MAX_BYTES", "4611686018427387904"},
           {"TPCOMM_CUSTOM_AR_MAX_BYTES", "5G"},
           {"TPCOMM_CUSTOM_AR_REGISTER_BYTES", "4611686018427387904"},
           {"TPCOMM_FUSION_MAX_TOKENS", "65537"},
           {"TPCOMM_FUSION_MAX_TOKENS", "-1"},
           {"TPCOMM_FUSION_MAX_TOKENS", "12x"},
           {"TPCOMM_FUSION_HIDDEN", "0"},
           {"TPCOMM_FUSION_HIDDEN", "100000"}}) {
    try {
      from({{name, value}});
      FAIL() << name << "=" << value << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

// Every deadline is computed as now + timeout (nanoseconds for the kernels and NCCL): a value
// past the cap would overflow there, so it is refused when read.
TEST(Options, TimeoutIsCappedAtOneYear) {
  EXPECT_EQ(from({{"TPCOMM_TIMEOUT_MS", "31536000000"}}).timeout_ms, 31536000000);
  for (const char* value : {"31536000001", "9223372036854775807", "99999999999999999999"}) {
    SCOPED_TRACE(value);
    try {
      from({{"TPCOMM_TIMEOUT_MS", value}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      const std::string what = e.what();
      EXPECT_NE(what.find("TPCOMM_TIMEOUT_MS"), std::string::npos) << what;
      EXPECT_NE(what.find("at most 31536000000 (365 days)"), std::string::npos) << what;
    }
  }
}

// A heartbeat comes every 1/20 of the timeout but at most every 10 ms: a timeout of a few
// periods would report a healthy rank lost, so it is refused below a floor, naming the range.
TEST(Options, HeartbeatTimeoutHasAFloorOfSeveralBeats) {
  EXPECT_EQ(from({{"TPCOMM_HEARTBEAT_TIMEOUT_MS", "200"}}).heartbeat_timeout_ms, 200);
  EXPECT_GE(Options::kMinHeartbeatTimeoutMs, 100);
  for (const char* value : {"1", "5", "10", "199", "0", "-3"}) {
    SCOPED_TRACE(value);
    try {
      from({{"TPCOMM_HEARTBEAT_TIMEOUT_MS", value}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      const std::string what = e.what();
      EXPECT_NE(what.find("TPCOMM_HEARTBEAT_TIMEOUT_MS"), std::string::npos) << what;
      EXPECT_NE(what.find("from 200 to 31536000000"), std::string::npos) << what;
    }
  }
}

// The store refuses longer tokens; the error names the variable and never repeats the secret.
TEST(Options, OverlongStoreTokenNamesTheVariable) {
  EXPECT_EQ(from({{"TPCOMM_STORE_TOKEN", std::string(1024, 't')}}).store_token.size(), 1024u);
  try {
    from({{"TPCOMM_STORE_TOKEN", std::string(1025, 't')}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("TPCOMM_STORE_TOKEN"), std::string::npos) << what;
    EXPECT_NE(what.find("longer than 1024 bytes"), std::string::npos) << what;
    EXPECT_EQ(what.find("tttt"), std::string::npos) << what;
  }
}

// A scratch directory, removed with what it holds.
class TokenFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tpcomm-token-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& contents) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  // The error `TPCOMM_STORE_TOKEN_FILE=path` gives; "" when it is accepted.
  static std::string error_of(const std::string& path) {
    try {
      from({{"TPCOMM_STORE_TOKEN_FILE", path}});
      return "";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      return e.what();
    }
  }
  std::string dir_;
};

TEST_F(TokenFile, TheTokenIsTheFileLessTrailingNewlines) {
  const std::string path = write("token", "s3cret\r\n\n");
  Options o = from({{"TPCOMM_STORE_TOKEN_FILE", path}});
  EXPECT_EQ(o.store_token, "s3cret");
  EXPECT_EQ(o.store_token_file, path);
  EXPECT_EQ(from({{"TPCOMM_STORE_TOKEN_FILE", write("long", std::string(1024, 't') + "\n")}})
                .store_token.size(),
            1024u);
  // Empty is the same as unset.
  EXPECT_TRUE(from({{"TPCOMM_STORE_TOKEN_FILE", ""}}).store_token.empty());
}

TEST_F(TokenFile, BadFilesAreErrorsNamingTheVariable) {
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir_ + "/missing", "cannot open it"},
      {write("empty", ""), "the file is empty"},
      {write("newlines", "\n\n"), "the file is empty"},
      {write("overlong", std::string(1025, 't')), "longer than 1024 bytes"},
      {write("huge", std::string(100000, 't')), "longer than 1024 bytes"},
      {dir_, "not a regular file"},
      // A FIFO with no writer: refused at once, not waited on.
      {dir_ + "/fifo", "not a regular file"},
  };
  for (const auto& [path, needle] : cases) {
    SCOPED_TRACE(path);
    const std::string what = error_of(path);
    EXPECT_NE(what.find("TPCOMM_STORE_TOKEN_FILE=\"" + path + "\""), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find("tttt"), std::string::npos) << what;
  }
  if (::geteuid() != 0) {
    const std::string path = write("private", "s3cret");
    ::chmod(path.c_str(), 0);
    EXPECT_NE(error_of(path).find("cannot open it"), std::string::npos);
  }
}

// Two sources of one secret are refused rather than one of them picked silently.
TEST_F(TokenFile, TokenAndTokenFileTogetherAreAnError) {
  const std::string path = write("token", "from-file");
  try {
    from({{"TPCOMM_STORE_TOKEN", "from-env"}, {"TPCOMM_STORE_TOKEN_FILE", path}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("TPCOMM_STORE_TOKEN and TPCOMM_STORE_TOKEN_FILE are both set"),
              std::string::npos)
        << what;
  }
  // An empty TPCOMM_STORE_TOKEN counts as unset.
  EXPECT_EQ(from({{"TPCOMM_STORE_TOKEN", ""}, {"TPCOMM_STORE_TOKEN_FILE", path}}).store_token,
            "from-file");
}

TEST(Options, LmHeadA2aSwitch) {
  const std::vector<std::pair<std::string, Switch>> accepted = {
      {"auto", Switch::kAuto}, {"AUTO", Switch::kAuto}, {"Auto", Switch::kAuto},
      {"1", Switch::kOn},      {"on", Switch::kOn},     {"ON", Switch::kOn},
      {"true", Switch::kOn},   {"True", Switch::kOn},   {"yes", Switch::kOn},
      {"0", Switch::kOff},     {"off", Switch::kOff},   {"Off", Switch::kOff},
      {"false", Switch::kOff}, {"FALSE", Switch::kOff}, {"no", Switch::kOff},
  };
  for (const auto& [value, want] : accepted) {
    SCOPED_TRACE(value);
    EXPECT_EQ(from({{"TPCOMM_LM_HEAD_A2A", value}}).lm_head_a2a, want);
  }
  for (const char* value : {"", "2", "-1", "automatic", "enabled", "on ", " 1", "default"}) {
    SCOPED_TRACE(value);
    try {
      from({{"TPCOMM_LM_HEAD_A2A", value}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("TPCOMM_LM_HEAD_A2A=\"" + std::string(value) + "\""),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("expected auto, 1 or 0"), std::string::npos) << e.what();
    }
  }
}

TEST(Options, LamportSizeIsBounded) {
  EXPECT_EQ(from({{"TPCOMM_LAMPORT_MAX_BYTES", "0"}}).lamport_max_bytes, 0);
  EXPECT_EQ(from({{"TPCOMM_LAMPORT_MAX_BYTES", "1G"}}).lamport_max_bytes, std::int64_t{1} << 30);
  EXPECT_THROW(from({{"TPCOMM_LAMPORT_MAX_BYTES", "2G"}}), Error);
}

TEST(Options, FusionBatchSizesTheLamportSlots) {
  // The default: 128 rows of 8192 in the two-shot form (each slot holds a rank's share of the
  // input and of the sums), 12 MiB of receive buffers per rank at every world size (3 buffers x
  // world size x slot; a little more where the shares round up).
  const Options d;
  EXPECT_EQ(lamport_slot_bytes(d, 2), std::int64_t{2} << 20);
  EXPECT_EQ(lamport_slot_bytes(d, 4), std::int64_t{1} << 20);
  EXPECT_EQ(lamport_slot_bytes(d, 8), std::int64_t{512} << 10);
  for (int w : {2, 3, 4, 5, 6, 7, 8})
    EXPECT_LE(3 * w * lamport_slot_bytes(d, w), (std::int64_t{12} << 20) + 1024) << w;
  // The larger of the two wins; 0 tokens leaves TPCOMM_LAMPORT_MAX_BYTES alone; no Lamport
  // buffers at all stays so.
  EXPECT_EQ(lamport_slot_bytes(from({{"TPCOMM_LAMPORT_MAX_BYTES", "4M"}}), 8), 4 << 20);
  EXPECT_EQ(lamport_slot_bytes(from({{"TPCOMM_FUSION_MAX_TOKENS", "0"}}), 2), 512 << 10);
  EXPECT_EQ(lamport_slot_bytes(
                from({{"TPCOMM_FUSION_MAX_TOKENS", "256"}, {"TPCOMM_FUSION_HIDDEN", "7168"}}), 4),
            2 * (256 * 7168 * 2 / 4));
  EXPECT_EQ(lamport_slot_bytes(from({{"TPCOMM_LAMPORT_MAX_BYTES", "0"}}), 2), 0);
  // Bounded (malformed values: MalformedValuesAreErrorsNamingTheVariable).
  EXPECT_EQ(from({{"TPCOMM_FUSION_MAX_TOKENS", "65536"}}).fusion_max_tokens, 65536);
}

// The rows size the Lamport slots as TPCOMM_LAMPORT_MAX_BYTES does, under the same 1 GiB cap:
// 65536 x 65536 rows would be an 8 GiB slot (about 48 GiB of peer memory a rank at 2 ranks).
TEST(Options, FusionRowsAreCappedLikeTheLamportBytes) {
  const Options most =
      from({{"TPCOMM_FUSION_MAX_TOKENS", "65536"}, {"TPCOMM_FUSION_HIDDEN", "8192"}});
  EXPECT_EQ(lamport_slot_bytes(most, 2), Options::kMaxLamportBytes);
  for (const char* hidden : {"65536", "8193"}) {
    SCOPED_TRACE(hidden);
    try {
      from({{"TPCOMM_FUSION_MAX_TOKENS", "65536"}, {"TPCOMM_FUSION_HIDDEN", hidden}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      const std::string what = e.what();
      EXPECT_NE(what.find("TPCOMM_FUSION_MAX_TOKENS (65536) x TPCOMM_FUSION_HIDDEN"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("at most 1 GiB"), std::string::npos) << what;
    }
  }
}

TEST(Parse, Bytes) {
  EXPECT_EQ(parse_bytes("512"), 512);
  EXPECT_EQ(parse_bytes("1K"), 1024);
  EXPECT_EQ(parse_bytes("8KiB"), 8192);
  EXPECT_EQ(parse_bytes("64m"), 64 << 20);
  EXPECT_EQ(parse_bytes("2G"), std::int64_t{2} << 30);
  EXPECT_FALSE(parse_bytes("").has_value());
  EXPECT_FALSE(parse_bytes("K").has_value());
  EXPECT_FALSE(parse_bytes("-1").has_value());
  EXPECT_FALSE(parse_bytes("1T").has_value());
  EXPECT_FALSE(parse_bytes("99999999999999999999").has_value());
  EXPECT_FALSE(parse_bytes("9999999999999G").has_value());
  EXPECT_EQ(format_bytes(8 << 20), "8 MiB");
  EXPECT_EQ(format_bytes(1536), "1536 B");
  EXPECT_EQ(format_bytes(0), "0 B");
}

TEST(Parse, IntAndBool) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-7"), -7);
  EXPECT_FALSE(parse_int("4 2").has_value());
  EXPECT_FALSE(parse_int("").has_value());
  EXPECT_EQ(parse_bool("ON"), true);
  EXPECT_EQ(parse_bool("false"), false);
  EXPECT_FALSE(parse_bool("2").has_value());
  EXPECT_EQ(parse_switch("auto"), Switch::kAuto);
  EXPECT_EQ(parse_switch("Yes"), Switch::kOn);
  EXPECT_EQ(parse_switch("0"), Switch::kOff);
  EXPECT_FALSE(parse_switch("").has_value());
  EXPECT_FALSE(parse_switch("automatic").has_value());
}

TEST(Options, FailureModesByName) {
  for (FailureMode m : {FailureMode::kRaise, FailureMode::kTeardown, FailureMode::kCallback}) {
    EXPECT_EQ(parse_failure_mode(to_string(m)), m);
  }
  EXPECT_EQ(parse_failure_mode("CALLBACK"), FailureMode::kCallback);
  for (const char* bad : {"", "0", "abort", "raise ", "skip"})
    EXPECT_FALSE(parse_failure_mode(bad).has_value()) << bad;
}

}  // namespace
}  // namespace tpcomm
