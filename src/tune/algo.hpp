// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce algorithms and a launch configuration for one of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tpcomm {

/// A custom all-reduce algorithm; kNone means "not the custom kernels" (NCCL serves).
enum class Algo : std::uint8_t { kNone, kOneShot, kTwoShot };

std::string_view to_string(Algo a) noexcept;
std::optional<Algo> parse_algo(std::string_view s) noexcept;

/// An algorithm with its launch shape: blocks per rank's kernel and threads per block.
struct Choice {
  Algo algo = Algo::kNone;
  int blocks = 0;
  int threads = 0;
  friend bool operator==(const Choice&, const Choice&) = default;
};

}  // namespace tpcomm
