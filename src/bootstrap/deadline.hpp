// SPDX-License-Identifier: Apache-2.0
// Deadlines of the store and the launcher: a steady-clock instant, computed without overflow.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tpcomm {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

/// A deadline that never passes.
inline constexpr Deadline kNoDeadline = Deadline::max();

/// Longest wait that is honoured as given; longer ones (and `Milliseconds::max()`) are clamped,
/// so that `now + timeout` cannot overflow.
inline constexpr std::chrono::milliseconds kLongestWait{std::int64_t{365} * 24 * 3600 * 1000};

/// `now + timeout`, with a negative timeout meaning "already passed" and an absurdly long one
/// clamped to `kLongestWait`.
inline Deadline deadline_after(std::chrono::milliseconds timeout) noexcept {
  return SteadyClock::now() + std::clamp(timeout, std::chrono::milliseconds{0}, kLongestWait);
}

/// Time left until `deadline`, rounded up to whole milliseconds so that a wait of the result
/// never ends before the deadline; zero once it has passed.
inline std::chrono::milliseconds remaining(Deadline deadline) noexcept {
  if (deadline == kNoDeadline) return kLongestWait;
  auto now = SteadyClock::now();
  if (deadline <= now) return std::chrono::milliseconds{0};
  return std::min(std::chrono::ceil<std::chrono::milliseconds>(deadline - now), kLongestWait);
}

}  // namespace tpcomm
