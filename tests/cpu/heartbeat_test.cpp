// SPDX-License-Identifier: Apache-2.0
// The rank watch over a store tpcomm does not run: heartbeats (NOTE [heartbeat watch]).
#include "bootstrap/heartbeat.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/rank_watch.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// Waits up to `limit` for `watch` to report a loss.
bool reported_within(const RankWatch& watch, Milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (watch.lost()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return watch.lost().has_value();
}

TEST(RankWatch, HeartbeatReportsAPeerThatStoppedBeating) {
  auto shared = std::make_shared<InProcessStore>();
  const auto store = with_heartbeat(shared, 0, 3, 300ms);
  const auto watch = store->rank_watch();
  ASSERT_NE(watch, nullptr);
  // Rank 1 beats for a while and then stops, as a killed or stopped process does; rank 2 beats
  // throughout. Rank 1 is the one reported, after the timeout and not before.
  const auto start = Clock::now();
  while (Clock::now() - start < 400ms) {
    if (Clock::now() - start < 200ms) shared->add("tpcomm/heartbeat/1", 1, 1s);
    shared->add("tpcomm/heartbeat/2", 1, 1s);
    std::this_thread::sleep_for(10ms);
    EXPECT_FALSE(watch->lost()) << watch->lost()->reason;
  }
  std::thread beater([&] {
    for (int i = 0; i < 100 && !watch->lost(); ++i) {
      shared->add("tpcomm/heartbeat/2", 1, 1s);
      std::this_thread::sleep_for(10ms);
    }
  });
  ASSERT_TRUE(reported_within(*watch, 1s));
  beater.join();
  EXPECT_EQ(watch->lost()->rank, 1);
  EXPECT_NE(watch->lost()->reason.find("rank 1 stopped beating"), std::string::npos)
      << watch->lost()->reason;
  // A wait on the store then ends at once with the loss, not at its deadline.
  const auto before = Clock::now();
  try {
    (void)store->get("never", 30s);
    ADD_FAILURE() << "a wait outlived the lost rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kAborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 stopped beating"), std::string::npos);
  }
  EXPECT_LT(Clock::now() - before, 1s);
}

TEST(RankWatch, HeartbeatTakesANormalLeaveAndAPeerNotYetStartedForAlive) {
  auto shared = std::make_shared<InProcessStore>();
  const auto zero = with_heartbeat(shared, 0, 3, 200ms);
  {
    const auto one = with_heartbeat(shared, 1, 3, 200ms);
    std::this_thread::sleep_for(150ms);
  }  // rank 1 leaves normally: its bye key is set
  // Rank 2 never beats: the bootstrap's deadline is what reports such a rank, not the watch.
  std::this_thread::sleep_for(700ms);
  EXPECT_FALSE(zero->rank_watch()->lost()) << zero->rank_watch()->lost()->reason;
  // A key set meanwhile is waited for and read through the heartbeat store as through any.
  shared->set("k", std::string_view("v"), 1s);
  const Bytes v = zero->get("k", 1s);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.data()), v.size()), "v");
}

TEST(RankWatch, HeartbeatWaitsKeepTheirDeadline) {
  auto shared = std::make_shared<InProcessStore>();
  const auto store = with_heartbeat(shared, 0, 2, 5s);
  const auto before = Clock::now();
  try {
    (void)store->get("missing", 450ms);
    ADD_FAILURE() << "a get of a missing key returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout) << e.what();
  }
  const auto took = Clock::now() - before;
  EXPECT_GE(took, 440ms);
  EXPECT_LT(took, 1500ms);
  EXPECT_THROW((void)with_heartbeat(shared, 2, 2, 1s), Error);
}

}  // namespace
}  // namespace tpcomm
