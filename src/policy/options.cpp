// SPDX-License-Identifier: Apache-2.0
// Options::from_env and the strict parsers behind it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "bootstrap/wire.hpp"
#include "core/check.hpp"
#include "core/parse.hpp"
#include "ipc/layout.hpp"
#include "tpcomm/options.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

constexpr std::array<std::pair<LogLevel, std::string_view>, 6> kLevelNames{{
    {LogLevel::kOff, "off"},
    {LogLevel::kError, "error"},
    {LogLevel::kWarn, "warn"},
    {LogLevel::kInfo, "info"},
    {LogLevel::kDebug, "debug"},
    {LogLevel::kTrace, "trace"},
}};

constexpr std::array<std::pair<FailureMode, std::string_view>, 3> kFailureModeNames{{
    {FailureMode::kRaise, "raise"},
    {FailureMode::kTeardown, "teardown"},
    {FailureMode::kCallback, "callback"},
}};

constexpr std::array<std::pair<Determinism, std::string_view>, 3> kDeterminismNames{{
    {Determinism::kOff, "0"},
    {Determinism::kOn, "1"},
    {Determinism::kStrict, "strict"},
}};

// The token in the file `path` names (TPCOMM_STORE_TOKEN_FILE): its contents less trailing
// newlines. Only a regular file is read, so a FIFO or a device cannot block or feed the
// process. Errors name the variable and the path, never the contents.
std::string read_token_file(const std::string& path) {
  constexpr const char* kVar = "TPCOMM_STORE_TOKEN_FILE";
  auto fail = [&](const std::string& why) {
    TPCOMM_THROW(Status::kInvalidArgument, kVar, "=\"", path, "\" is not valid: ", why);
  };
  // O_NONBLOCK: opening a FIFO for reading does not wait for a writer; fstat then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) fail(detail::concat("cannot open it: ", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(detail::concat("cannot stat it: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  // Room for the longest token and a CR LF after it, and one byte to tell a longer file.
  std::string text(wire::kMaxTokenBytes + 3, '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(detail::concat("cannot read it: ", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (text.empty()) fail("the file is empty (a token is needed)");
  if (got == wire::kMaxTokenBytes + 3 || text.size() > wire::kMaxTokenBytes) {
    fail(detail::concat("the token is longer than ", wire::kMaxTokenBytes, " bytes"));
  }
  return text;
}

}  // namespace

std::optional<std::int64_t> parse_int(std::string_view s) noexcept {
  std::int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::optional<std::int64_t> parse_bytes(std::string_view s) noexcept {
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return std::nullopt;
  auto base = parse_int(s.substr(0, digits));
  if (!base) return std::nullopt;
  std::string suffix = lower(s.substr(digits));
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else {
    return std::nullopt;
  }
  if (*base > (std::numeric_limits<std::int64_t>::max() >> shift)) return std::nullopt;
  return *base << shift;
}

std::optional<bool> parse_bool(std::string_view s) noexcept {
  std::string v = lower(s);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return std::nullopt;
}

std::optional<Switch> parse_switch(std::string_view s) noexcept {
  if (lower(s) == "auto") return Switch::kAuto;
  auto b = parse_bool(s);
  if (!b) return std::nullopt;
  return *b ? Switch::kOn : Switch::kOff;
}

std::string format_bytes(std::int64_t bytes) {
  static constexpr std::array<std::string_view, 4> kUnits{"B", "KiB", "MiB", "GiB"};
  std::size_t u = 0;
  while (u + 1 < kUnits.size() && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return detail::concat(bytes, " ", kUnits[u]);
}

std::string_view to_string(LogLevel l) noexcept {
  for (const auto& [k, n] : kLevelNames)
    if (k == l) return n;
  return "unknown";
}

std::optional<LogLevel> parse_log_level(std::string_view s) noexcept {
  std::string v = lower(s);
  if (v == "warning") v = "warn";
  if (v == "none") v = "off";
  for (const auto& [k, n] : kLevelNames)
    if (n == v) return k;
  return std::nullopt;
}

std::string_view to_string(FailureMode m) noexcept {
  for (const auto& [k, n] : kFailureModeNames)
    if (k == m) return n;
  return "unknown";
}

std::optional<FailureMode> parse_failure_mode(std::string_view s) noexcept {
  const std::string v = lower(s);
  for (const auto& [k, n] : kFailureModeNames)
    if (n == v) return k;
  return std::nullopt;
}

std::string_view to_string(Determinism d) noexcept {
  for (const auto& [k, n] : kDeterminismNames)
    if (k == d) return n;
  return "unknown";
}

std::optional<Determinism> parse_determinism(std::string_view s) noexcept {
  if (lower(s) == "strict") return Determinism::kStrict;
  auto b = parse_bool(s);
  if (!b) return std::nullopt;
  return *b ? Determinism::kOn : Determinism::kOff;
}

Options Options::from_lookup(const std::function<std::optional<std::string>(const char*)>& getenv) {
  Options o;
  auto bad = [](const char* name, const std::string& value, std::string_view expected) {
    TPCOMM_THROW(Status::kInvalidArgument, name, "=\"", value, "\" is not valid: expected ",
                 expected);
  };
  if (auto v = getenv("TPCOMM_LOG")) {
    auto l = parse_log_level(*v);
    if (!l) bad("TPCOMM_LOG", *v, "off, error, warn, info, debug or trace");
    o.log_level = *l;
  }
  if (auto v = getenv("TPCOMM_NCCL_PATH"); v && !v->empty()) o.nccl_path = *v;
  if (auto v = getenv("TPCOMM_TIMEOUT_MS")) {
    auto t = parse_int(*v);
    if (!t || *t <= 0 || *t > kMaxTimeoutMs) {
      bad("TPCOMM_TIMEOUT_MS", *v,
          detail::concat("a positive number of milliseconds, at most ", kMaxTimeoutMs,
                         " (365 days)"));
    }
    o.timeout_ms = *t;
  }
  if (auto v = getenv("TPCOMM_HEARTBEAT_TIMEOUT_MS")) {
    auto t = parse_int(*v);
    if (!t || *t < kMinHeartbeatTimeoutMs || *t > kMaxTimeoutMs) {
      bad("TPCOMM_HEARTBEAT_TIMEOUT_MS", *v,
          detail::concat("milliseconds from ", kMinHeartbeatTimeoutMs, " to ", kMaxTimeoutMs,
                         " (a heartbeat every 1/20 of it, 10 to 500 ms: below ",
                         kMinHeartbeatTimeoutMs, " ms a healthy rank would be reported lost)"));
    }
    o.heartbeat_timeout_ms = *t;
  }
  if (auto v = getenv("TPCOMM_ALGO")) {
    Pinned pinned;
    if (!parse_pinned(*v, &pinned)) bad("TPCOMM_ALGO", *v, "one of " + pinned_names());
    o.algo = std::string(to_string(pinned));
  }
  if (auto v = getenv("TPCOMM_EXCHANGE_ALGO")) {
    PinnedExchange pinned;
    if (!parse_pinned_exchange(*v, &pinned))
      bad("TPCOMM_EXCHANGE_ALGO", *v, "one of auto, " + exchange_names());
    o.exchange_algo = std::string(to_string(pinned));
  }
  if (auto v = getenv("TPCOMM_TUNE_FILE")) o.tune_file = *v;
  if (auto v = getenv("TPCOMM_CUSTOM_AR_MAX_BYTES")) {
    auto b = parse_bytes(*v);
    // Each rank holds three times this in peer memory (two staging halves and the scratch).
    if (!b || *b <= 0 || *b % 16 != 0 || *b > kMaxCustomArBytes)
      bad("TPCOMM_CUSTOM_AR_MAX_BYTES", *v,
          "a positive multiple of 16 bytes up to 4G such as 8M (each rank holds three times this "
          "in peer memory)");
    o.custom_ar_max_bytes = *b;
  }
  if (auto v = getenv("TPCOMM_CUSTOM_AR_REGISTER_BYTES")) {
    auto b = parse_bytes(*v);
    if (!b || *b > kMaxCustomArBytes)
      bad("TPCOMM_CUSTOM_AR_REGISTER_BYTES", *v, "a byte count up to 4G such as 2M (0: always)");
    o.custom_ar_register_min_bytes = *b;
  }
  if (auto v = getenv("TPCOMM_LAMPORT_MAX_BYTES")) {
    auto b = parse_bytes(*v);
    if (!b || *b % 16 != 0 || *b > kMaxLamportBytes)
      bad("TPCOMM_LAMPORT_MAX_BYTES", *v,
          "a multiple of 16 bytes up to 1G such as 512K (0: off; each rank holds 3 x world size "
          "x this in peer memory)");
    o.lamport_max_bytes = *b;
  }
  auto count = [&](const char* name, std::int64_t most, std::int64_t least, std::int64_t& field) {
    if (auto v = getenv(name)) {
      auto n = parse_int(*v);
      if (!n || *n < least || *n > most)
        bad(name, *v, detail::concat("a whole number from ", least, " to ", most));
      field = *n;
    }
  };
  count("TPCOMM_FUSION_MAX_TOKENS", 65536, 0, o.fusion_max_tokens);
  count("TPCOMM_FUSION_HIDDEN", 65536, 1, o.fusion_hidden);
  // The rows size the Lamport slots as the byte knob does (`lamport_slot_bytes`): the same cap,
  // or 65536 x 65536 rows would ask for an 8 GiB slot, tens of GiB of peer memory per rank.
  if (const std::int64_t rows = o.fusion_max_tokens * o.fusion_hidden * 2;
      rows > kMaxLamportBytes) {
    TPCOMM_THROW(Status::kInvalidArgument, "TPCOMM_FUSION_MAX_TOKENS (", o.fusion_max_tokens,
                 ") x TPCOMM_FUSION_HIDDEN (", o.fusion_hidden, ") rows of 2 bytes are ",
                 format_bytes(rows), ": at most ", format_bytes(kMaxLamportBytes),
                 ", the cap of TPCOMM_LAMPORT_MAX_BYTES (each rank holds 3 x world size x its "
                 "share in peer memory)");
  }
  auto flag = [&](const char* name, bool& field) {
    if (auto v = getenv(name)) {
      auto b = parse_bool(*v);
      if (!b) bad(name, *v, "0 or 1");
      field = *b;
    }
  };
  flag("TPCOMM_DISABLE_CUSTOM_AR", o.disable_custom_ar);
  flag("TPCOMM_DISABLE_NCCL", o.disable_nccl);
  flag("TPCOMM_PDL", o.programmatic_launch);
  flag("TPCOMM_RANK_WATCH", o.rank_watch);
  flag("TPCOMM_STORE_REQUIRE_TOKEN", o.store_require_token);
  if (auto v = getenv("TPCOMM_ASYNC_ERROR_HANDLING")) {
    auto m = parse_failure_mode(*v);
    if (!m) bad("TPCOMM_ASYNC_ERROR_HANDLING", *v, "raise, teardown or callback");
    o.failure_mode = *m;
  }
  if (auto v = getenv("TPCOMM_LM_HEAD_A2A")) {
    auto s = parse_switch(*v);
    if (!s) bad("TPCOMM_LM_HEAD_A2A", *v, "auto, 1 or 0 (or on/off, true/false)");
    o.lm_head_a2a = *s;
  }
  if (auto v = getenv("TPCOMM_MOE_PROLOGUE")) {
    auto s = parse_switch(*v);
    if (!s) bad("TPCOMM_MOE_PROLOGUE", *v, "auto, 1 or 0 (or on/off, true/false)");
    o.moe_prologue = *s;
  }
  if (auto v = getenv("TPCOMM_NCCL_CHECK")) {
    auto s = parse_switch(*v);
    if (!s) bad("TPCOMM_NCCL_CHECK", *v, "auto, 1 or 0 (or on/off, true/false)");
    o.nccl_check = *s;
  }
  if (auto v = getenv("TPCOMM_STORE_TOKEN")) {
    // The value is a secret: the message gives its length, never its bytes.
    if (v->size() > wire::kMaxTokenBytes) {
      TPCOMM_THROW(Status::kInvalidArgument, "TPCOMM_STORE_TOKEN is not valid: the store token is ",
                   v->size(), " bytes, longer than ", wire::kMaxTokenBytes, " bytes");
    }
    o.store_token = *v;
  }
  if (auto v = getenv("TPCOMM_STORE_TOKEN_FILE"); v && !v->empty()) {
    // Two sources of one secret: refuse rather than pick one silently.
    if (!o.store_token.empty()) {
      TPCOMM_THROW(Status::kInvalidArgument,
                   "TPCOMM_STORE_TOKEN and TPCOMM_STORE_TOKEN_FILE are both set: set only one");
    }
    o.store_token_file = *v;
    o.store_token = read_token_file(*v);
  }
  if (auto v = getenv("TPCOMM_STORE_BIND")) o.store_bind = *v;
  if (auto v = getenv("TPCOMM_DETERMINISTIC")) {
    auto d = parse_determinism(*v);
    if (!d) bad("TPCOMM_DETERMINISTIC", *v, "0, 1 or strict (or on/off, true/false)");
    o.deterministic = *d;
  }
  return o;
}

std::span<const std::string_view> knob_names() noexcept {
  static constexpr std::array<std::string_view, 25> kNames{
      "TPCOMM_LOG",
      "TPCOMM_NCCL_PATH",
      "TPCOMM_TIMEOUT_MS",
      "TPCOMM_ALGO",
      "TPCOMM_EXCHANGE_ALGO",
      "TPCOMM_TUNE_FILE",
      "TPCOMM_CUSTOM_AR_MAX_BYTES",
      "TPCOMM_CUSTOM_AR_REGISTER_BYTES",
      "TPCOMM_LAMPORT_MAX_BYTES",
      "TPCOMM_FUSION_MAX_TOKENS",
      "TPCOMM_FUSION_HIDDEN",
      "TPCOMM_DISABLE_CUSTOM_AR",
      "TPCOMM_DISABLE_NCCL",
      "TPCOMM_PDL",
      "TPCOMM_RANK_WATCH",
      "TPCOMM_HEARTBEAT_TIMEOUT_MS",
      "TPCOMM_ASYNC_ERROR_HANDLING",
      "TPCOMM_LM_HEAD_A2A",
      "TPCOMM_MOE_PROLOGUE",
      "TPCOMM_NCCL_CHECK",
      "TPCOMM_STORE_TOKEN",
      "TPCOMM_STORE_TOKEN_FILE",
      "TPCOMM_STORE_BIND",
      "TPCOMM_STORE_REQUIRE_TOKEN",
      "TPCOMM_DETERMINISTIC",
  };
  return kNames;
}

std::int64_t lamport_slot_bytes(const Options& o, int world_size) noexcept {
  if (o.lamport_max_bytes <= 0) return 0;
  std::int64_t slot = std::min(o.lamport_max_bytes, o.custom_ar_max_bytes);
  if (o.fusion_max_tokens > 0 && world_size > 0)
    slot = std::max(
        slot, lamport_two_shot_slot_bytes(o.fusion_max_tokens * o.fusion_hidden * 2, world_size));
  return slot;
}

Options Options::from_env() {
  return from_lookup([](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace tpcomm
