// SPDX-License-Identifier: Apache-2.0
// Levelled logging to stderr, filtered by TPCOMM_LOG.
#pragma once

#include <string_view>

#include "core/check.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm::log {

/// The current level; starts from `TPCOMM_LOG` (read once), changed by `set_level`.
LogLevel level() noexcept;
void set_level(LogLevel l) noexcept;
inline bool enabled(LogLevel l) noexcept { return l != LogLevel::kOff && l <= level(); }

/// Writes one line "[tpcomm <pid> <L>] message" to stderr, atomically with respect to other
/// log lines of this process.
void write(LogLevel l, std::string_view message) noexcept;

}  // namespace tpcomm::log

#define TPCOMM_LOG_AT(lvl, ...)                                           \
  do {                                                                    \
    if (::tpcomm::log::enabled(lvl))                                      \
      ::tpcomm::log::write((lvl), ::tpcomm::detail::concat(__VA_ARGS__)); \
  } while (0)
#define TPCOMM_LOG_ERROR(...) TPCOMM_LOG_AT(::tpcomm::LogLevel::kError, __VA_ARGS__)
#define TPCOMM_LOG_WARN(...) TPCOMM_LOG_AT(::tpcomm::LogLevel::kWarn, __VA_ARGS__)
#define TPCOMM_LOG_INFO(...) TPCOMM_LOG_AT(::tpcomm::LogLevel::kInfo, __VA_ARGS__)
#define TPCOMM_LOG_DEBUG(...) TPCOMM_LOG_AT(::tpcomm::LogLevel::kDebug, __VA_ARGS__)
