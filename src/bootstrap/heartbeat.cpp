// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/heartbeat.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/deadline.hpp"
#include "bootstrap/rank_watch.hpp"
#include "core/check.hpp"

namespace tpcomm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr Milliseconds kSlice{200};

std::string beat_key(int rank) { return detail::concat("tpcomm/heartbeat/", rank); }
std::string bye_key(int rank) { return detail::concat("tpcomm/heartbeat/", rank, "/bye"); }

class HeartbeatStore final : public Store {
 public:
  HeartbeatStore(std::shared_ptr<Store> inner, int rank, int world_size, Milliseconds timeout)
      : inner_(std::move(inner)),
        rank_(rank),
        world_size_(world_size),
        timeout_(timeout),
        period_(std::clamp(timeout / 20, Milliseconds(10), Milliseconds(500))),
        watch_(std::make_shared<RankWatch>()) {
    set_default_timeout(inner_->default_timeout());
    // A bye left by an earlier bootstrap of this rank over the same store is not this one's.
    inner_->erase(bye_key(rank_), inner_->default_timeout());
    // The first beat before the bootstrap's collective steps: a peer that completed them with
    // this rank has seen it started, even if it dies at once.
    inner_->add(beat_key(rank_), 1, inner_->default_timeout());
    thread_ = std::thread([this] { run(); });
  }

  ~HeartbeatStore() override {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    try {  // A normal end: the others stop watching this rank.
      inner_->set(bye_key(rank_), std::string_view("bye"), period_ * 4);
    } catch (...) {  // NOLINT(bugprone-empty-catch) - the store may be gone first
    }
  }

  HeartbeatStore(const HeartbeatStore&) = delete;
  HeartbeatStore& operator=(const HeartbeatStore&) = delete;

  void set(std::string_view key, std::span<const std::byte> value, Milliseconds timeout) override {
    inner_->set(key, value, timeout);
  }
  // Waits go in slices, so that a peer reported lost ends them at once (kAborted), as the
  // waits of tpcomm's own store end when a rank is lost.
  Bytes get(std::string_view key, Milliseconds timeout) override {
    const std::string k(key);
    const std::vector<std::string> keys{k};
    wait(keys, timeout);
    return inner_->get(key, timeout);
  }
  std::int64_t add(std::string_view key, std::int64_t delta, Milliseconds timeout) override {
    return inner_->add(key, delta, timeout);
  }
  void wait(std::span<const std::string> keys, Milliseconds timeout) override {
    const Deadline deadline = deadline_after(timeout);
    for (;;) {
      if (const auto lost = watch_->lost())
        TPCOMM_THROW(Status::kAborted, "waiting for key '", keys.empty() ? "" : keys[0],
                     "': ", lost->reason);
      const Milliseconds left = remaining(deadline);
      try {
        inner_->wait(keys, std::min(left, kSlice));
        return;
      } catch (const Error& e) {
        if (e.status() != Status::kTimeout || left <= kSlice) throw;
      }
    }
  }
  bool check(std::span<const std::string> keys, Milliseconds timeout) override {
    return inner_->check(keys, timeout);
  }
  bool erase(std::string_view key, Milliseconds timeout) override {
    return inner_->erase(key, timeout);
  }
  [[nodiscard]] std::shared_ptr<RankWatch> rank_watch() const noexcept override { return watch_; }

 private:
  struct Peer {
    std::int64_t beats = 0;
    Clock::time_point moved;
    bool done = false;  // left normally, or reported
  };

  void run() {
    std::vector<Peer> peers(static_cast<std::size_t>(world_size_), Peer{0, Clock::now(), false});
    peers[static_cast<std::size_t>(rank_)].done = true;
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
      lock.unlock();
      // The store's failures are the deadlines' to report. Only exceptions: a thread that its
      // runtime ends while it is inside the store (Python ends the threads that call into it
      // once it is shutting down) must unwind, not be caught here.
      try {
        beat(peers);
      } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch)
      }
      lock.lock();
    }
  }

  void beat(std::vector<Peer>& peers) {
    const Milliseconds call = std::max(period_ * 4, Milliseconds(1000));
    inner_->add(beat_key(rank_), 1, call);
    if (watch_->lost()) return;
    for (int r = 0; r < world_size_; ++r) {
      Peer& p = peers[static_cast<std::size_t>(r)];
      if (p.done) continue;
      const std::int64_t beats = inner_->add(beat_key(r), 0, call);
      const Clock::time_point now = Clock::now();
      if (beats != p.beats || p.beats == 0) {  // moved, or not started: a peer never beating
        p.beats = beats;                       // is the bootstrap's deadline's to report
        p.moved = now;
        continue;
      }
      if (now - p.moved < timeout_) continue;
      p.done = true;
      const std::vector<std::string> bye{bye_key(r)};
      if (inner_->check(bye, call)) continue;
      const auto silent = std::chrono::duration_cast<Milliseconds>(now - p.moved).count();
      watch_->notify(
          r, detail::concat("rank ", r, " stopped beating on the application's store: ",
                            "no heartbeat for ", silent, " ms (TPCOMM_HEARTBEAT_TIMEOUT_MS)"));
      return;
    }
  }

  std::shared_ptr<Store> inner_;
  int rank_;
  int world_size_;
  Milliseconds timeout_;
  Milliseconds period_;
  std::shared_ptr<RankWatch> watch_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

std::shared_ptr<Store> with_heartbeat(std::shared_ptr<Store> inner, int rank, int world_size,
                                      Milliseconds timeout) {
  TPCOMM_CHECK(inner != nullptr && rank >= 0 && rank < world_size && timeout.count() > 0,
               Status::kInvalidArgument, "with_heartbeat: rank ", rank, " of ", world_size,
               ", timeout ", timeout.count(), " ms");
  return std::make_shared<HeartbeatStore>(std::move(inner), rank, world_size, timeout);
}

}  // namespace tpcomm
