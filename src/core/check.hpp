// SPDX-License-Identifier: Apache-2.0
// The few checking macros of the library. Setup code throws; hot-path code returns a Status.
#pragma once

#include <sstream>
#include <string>

#include "tpcomm/status.hpp"

namespace tpcomm::detail {

/// Builds "file:line: message" (for the debug log).
std::string where(const char* file, int line, const std::string& message);

/// Throws `Error(s, msg)`: the message is for users, so it carries no source path; the place
/// that threw goes to the debug log (`TPCOMM_LOG=debug`).
[[noreturn]] void throw_error(Status s, const char* file, int line, const std::string& msg);

template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace tpcomm::detail

/// Throws `Error(status)` with the streamed message when `cond` is false.
#define TPCOMM_CHECK(cond, status, ...)                                     \
  do {                                                                      \
    if (!(cond)) [[unlikely]] {                                             \
      ::tpcomm::detail::throw_error((status), __FILE__, __LINE__,           \
                                    ::tpcomm::detail::concat(__VA_ARGS__)); \
    }                                                                       \
  } while (0)

/// Throws `Error(status)` with the streamed message.
#define TPCOMM_THROW(status, ...) \
  ::tpcomm::detail::throw_error((status), __FILE__, __LINE__, ::tpcomm::detail::concat(__VA_ARGS__))

/// Evaluates an expression returning `Status` and returns it from the caller unless `kOk`.
#define TPCOMM_TRY(expr)                                                        \
  do {                                                                          \
    if (::tpcomm::Status s_ = (expr); s_ != ::tpcomm::Status::kOk) [[unlikely]] \
      return s_;                                                                \
  } while (0)
