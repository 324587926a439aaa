// SPDX-License-Identifier: Apache-2.0
#include "core/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace tpcomm {
namespace detail {

std::string where(const char* file, int line, const std::string& message) {
  std::string_view f(file);
  // Paths relative to the source tree read better than absolute build paths.
  for (std::string_view root : {"/src/", "/kernels/", "/tools/", "/tests/"}) {
    if (auto pos = f.rfind(root); pos != std::string_view::npos) {
      f.remove_prefix(pos + 1);
      break;
    }
  }
  return concat(f, ":", line, ": ", message);
}

void throw_error(Status s, const char* file, int line, const std::string& msg) {
  TPCOMM_LOG_DEBUG("throwing ", to_string(s), ": ", where(file, line, msg));
  throw Error(s, msg);
}

}  // namespace detail

namespace log {
namespace {

LogLevel initial_level() noexcept {
  const char* v = std::getenv("TPCOMM_LOG");
  if (v == nullptr) return LogLevel::kWarn;
  return parse_log_level(v).value_or(LogLevel::kWarn);
}

std::atomic<int>& level_storage() noexcept {
  static std::atomic<int> l{static_cast<int>(initial_level())};
  return l;
}

std::mutex& write_mutex() noexcept {
  static std::mutex m;
  return m;
}

constexpr char letter(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::kError:
      return 'E';
    case LogLevel::kWarn:
      return 'W';
    case LogLevel::kInfo:
      return 'I';
    case LogLevel::kDebug:
      return 'D';
    case LogLevel::kTrace:
      return 'T';
    case LogLevel::kOff:
      break;
  }
  return '?';
}

}  // namespace

LogLevel level() noexcept {
  return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed));
}

void set_level(LogLevel l) noexcept {
  level_storage().store(static_cast<int>(l), std::memory_order_relaxed);
}

void write(LogLevel l, std::string_view message) noexcept {
  std::lock_guard lock(write_mutex());
  std::fprintf(stderr, "[tpcomm %d %c] %.*s\n", static_cast<int>(getpid()), letter(l),
               static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
}

}  // namespace log
}  // namespace tpcomm
