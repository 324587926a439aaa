// SPDX-License-Identifier: Apache-2.0
// The group watchdog (src/coordinator/watchdog.hpp): it acts once on the first failure its check
// reports, within its period and without anyone asking, raises and calls back by mode, and stops at
// once.
#include "coordinator/watchdog.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace tpcomm {
namespace {

using Clock = std::chrono::steady_clock;

struct Seen {
  std::mutex m;
  int raised = 0;
  int called = 0;
  Status status = Status::kOk;
  std::string message;
};

TEST(Watchdog, RaisesOnceWithinItsPeriod) {
  std::atomic<bool> failed{false};
  std::atomic<int> checks{0};
  Seen seen;
  {
    Watchdog w(
        "test", FailureMode::kRaise,
        [&]() -> std::optional<Watchdog::Failure> {
          ++checks;
          if (!failed) return std::nullopt;
          return Watchdog::Failure{Status::kTimeout, "rank 1 stopped"};
        },
        [&](const Watchdog::Failure& f) {
          std::lock_guard lock(seen.m);
          ++seen.raised;
          seen.status = f.first;
          seen.message = f.second;
        });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GE(checks.load(), 2);
    {
      std::lock_guard lock(seen.m);
      EXPECT_EQ(seen.raised, 0);
    }
    const auto start = Clock::now();
    failed = true;
    while (Clock::now() - start < std::chrono::seconds(2)) {
      std::lock_guard lock(seen.m);
      if (seen.raised > 0) break;
    }
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(seen.raised, 1);
  EXPECT_EQ(seen.status, Status::kTimeout);
  EXPECT_EQ(seen.message, "rank 1 stopped");
}

TEST(Watchdog, CallbackModeRaisesThenCallsTheHandler) {
  std::atomic<bool> failed{false};
  Seen seen;
  {
    Watchdog w(
        "test", FailureMode::kRaise,
        [&]() -> std::optional<Watchdog::Failure> {
          if (!failed) return std::nullopt;
          return Watchdog::Failure{Status::kMismatch, "ranks called different collectives"};
        },
        [&](const Watchdog::Failure&) {
          std::lock_guard lock(seen.m);
          ++seen.raised;
        });
    w.set_mode(FailureMode::kCallback, [&](Status s, const std::string& message) {
      std::lock_guard lock(seen.m);
      EXPECT_EQ(seen.raised, 1) << "raised before the handler runs";
      ++seen.called;
      seen.status = s;
      seen.message = message;
    });
    failed = true;
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::seconds(2)) {
      std::lock_guard lock(seen.m);
      if (seen.called > 0) break;
    }
  }
  EXPECT_EQ(seen.called, 1);
  EXPECT_EQ(seen.status, Status::kMismatch);
  EXPECT_EQ(seen.message, "ranks called different collectives");
}

TEST(Watchdog, StopsAtOnceWhenNothingFailed) {
  int raised = 0;
  const auto start = Clock::now();
  {
    Watchdog w(
        "test", FailureMode::kRaise, [] { return std::optional<Watchdog::Failure>{}; },
        [&](const Watchdog::Failure&) { ++raised; });
  }
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_EQ(raised, 0);
}

TEST(WatchdogDeathTest, TeardownTakesTheProcessDown) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Watchdog w(
            "group of 2 ranks, rank 0", FailureMode::kTeardown,
            [] {
              return std::optional<Watchdog::Failure>({Status::kAborted, "rank 1 left"});
            },
            [](const Watchdog::Failure&) {});
        std::this_thread::sleep_for(std::chrono::seconds(5));
      },
      "rank 1 left; the group has failed; taking the process down");
}

}  // namespace
}  // namespace tpcomm
