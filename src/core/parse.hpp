// SPDX-License-Identifier: Apache-2.0
// Strict parsers for knob values: a malformed value is reported, never silently defaulted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tpcomm/types.hpp"

namespace tpcomm {

/// A byte count with an optional binary suffix, as nccl-tests reads -b/-e: "512", "8K", "8KiB",
/// "64M", "1G" (K = 1024). nullopt when malformed, negative or overflowing.
std::optional<std::int64_t> parse_bytes(std::string_view s) noexcept;

/// A whole decimal number; nullopt unless the whole string is one.
std::optional<std::int64_t> parse_int(std::string_view s) noexcept;

/// "1/0", "true/false", "yes/no", "on/off" (any case).
std::optional<bool> parse_bool(std::string_view s) noexcept;

/// "auto" → kAuto, else what `parse_bool` accepts: true → kOn, false → kOff (any case).
std::optional<Switch> parse_switch(std::string_view s) noexcept;

/// "8 MiB", "512 B", "1.5 KiB": a size for humans.
std::string format_bytes(std::int64_t bytes);

}  // namespace tpcomm
