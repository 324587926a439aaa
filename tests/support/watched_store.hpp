// SPDX-License-Identifier: Apache-2.0
// What the rank watch's and the store's trust tests share: a server for a job of ranks that watch
// each other, a client that watches as one of them, and what a subscriber of the watch heard.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "bootstrap/rank_watch.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm::testing {

/// A server for a job of `world_size` ranks, which watch each other.
inline TcpStoreServerConfig job(int world_size) {
  TcpStoreServerConfig c;
  c.world_size = world_size;
  return c;
}

/// A client of the store at `port` that watches as rank `rank`.
inline std::shared_ptr<TcpStore> watched(
    int port, int rank, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  TcpStore::Config c;
  c.port = port;
  c.timeout = timeout;
  c.watch_rank = rank;
  return std::make_shared<TcpStore>(std::move(c));
}

/// What a subscriber heard of a lost rank, and when.
struct Heard {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<RankWatch::Lost> lost;
  SteadyClock::time_point at;

  RankWatch::Callback callback() {
    return [this](int rank, const std::string& reason) {
      std::lock_guard lock(mu);
      lost = RankWatch::Lost{rank, reason};
      at = SteadyClock::now();
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return lost.has_value(); });
  }
  std::string reason() {
    std::lock_guard lock(mu);
    return lost ? lost->reason : std::string();
  }
};

}  // namespace tpcomm::testing
