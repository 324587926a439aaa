// SPDX-License-Identifier: Apache-2.0
// The TCP store server's state, shared by its connection loop and its request handlers.
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {

/// Compares in constant time, so the time a rejection takes says nothing about the secret (the
/// token, a rank's watch secret).
bool token_matches(std::span<const std::byte> given, std::string_view expected) noexcept;

struct TcpStoreServer::Impl {
  /// Where a connection is with authentication; it leaves kWaiting exactly once (a CAS), and
  /// whoever moves it out gives back its place in `unauthenticated`.
  enum class Auth { kWaiting, kDone, kDisplaced };
  /// What an authenticated connection is doing, for `displace_idle_rankless`: it leaves kIdle
  /// by a CAS, so a connection is displaced only between requests; one that stands for a rank
  /// (kRank) never is.
  enum class Use { kIdle, kBusy, kRank, kDisplaced };
  struct Connection {
    net::Socket sock;
    std::string peer;
    std::uint64_t id = 0;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<Auth> auth{Auth::kWaiting};
    std::atomic<Use> use{Use::kIdle};
    /// The rank this connection claimed (CLAIM), or -1. Its own thread only.
    std::int64_t claimed = -1;
    /// Whether a refusal for want of room in flight was logged as a warning; later ones are
    /// logged at debug level (`note_retry_later`). Its own thread only.
    bool warned_retry_later = false;
  };
  /// NOTE [rank watch]: one job rank's place, from its CLAIM on.
  struct RankSlot {
    enum class State { kClaimed, kWatched, kLeft, kLost };
    State state = State::kClaimed;
    std::uint64_t owner = 0;  // `Connection::id` of the claiming connection
    std::string peer;         // its address, for messages
    std::array<std::byte, wire::kWatchSecretBytes> secret{};
  };
  /// Bytes taken from `max_inflight_bytes` (NOTE [store memory bounds] 2), given back on
  /// destruction.
  class Held {
   public:
    explicit Held(Impl& m) noexcept : m_(m) {}
    ~Held() { release(); }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    /// Takes `n` more bytes; false (taking nothing) when that would go over the limit.
    bool take(std::size_t n) noexcept {
      std::size_t used = m_.inflight.load();
      do {
        if (n > m_.config.max_inflight_bytes - used) return false;
      } while (!m_.inflight.compare_exchange_weak(used, used + n));
      bytes_ += n;
      return true;
    }
    void release() noexcept {
      m_.inflight.fetch_sub(bytes_);
      bytes_ = 0;
    }

   private:
    Impl& m_;
    std::size_t bytes_ = 0;
  };
  struct Lingering {
    net::Socket sock;
    Deadline close_at;
  };
  enum class WaitResult { kFound, kTimeout, kGone, kOverLimit, kRankLost };

  TcpStoreServerConfig config;
  wire::Limits limits;
  net::Socket listener;
  int port = 0;
  net::Socket wake_read;
  net::Socket wake_write;
  std::thread acceptor;

  std::atomic<bool> stopping{false};
  std::atomic<std::int64_t> rejected{0};
  std::atomic<std::int64_t> displaced{0};
  std::atomic<int> waiting{0};
  std::atomic<int> watchers{0};
  std::atomic<std::size_t> inflight{0};
  std::atomic<std::uint64_t> received{0};  // payload bytes read from clients

  std::mutex stop_mu;
  bool stopped = false;

  // The key-value data. Every change notifies `data_cv`.
  std::mutex data_mu;
  std::condition_variable data_cv;
  std::unordered_map<std::string, Bytes> data;
  // NOTE [rank watch]: why the job's first lost rank is gone, and its rank; empty while no rank
  // is lost. Guarded by `data_mu`, so a waiter checks it with the keys.
  std::string lost;
  std::int64_t lost_rank = -1;
  // The ranks claimed so far, and what became of them. Guarded by `data_mu`.
  std::unordered_map<std::int64_t, RankSlot> ranks;
  std::size_t stored = 0;  // keys and values of `data`, in bytes

  // Connections: threads are started and joined by the accept thread (and by stop() once the
  // accept thread is gone). A connection's fd stays open until its thread has been joined, so
  // stop() can shut it down without racing a close and a reuse of the fd number.
  std::mutex conn_mu;
  std::list<std::unique_ptr<Connection>> conns;
  std::uint64_t next_connection_id = 1;  // guarded by `conn_mu`
  std::mutex count_mu;
  std::condition_variable count_cv;
  int active = 0;
  int unauthenticated = 0;           // connections in Auth::kWaiting
  std::vector<Lingering> lingering;  // accept thread only

  void wake() noexcept {
    char b = 1;
    ssize_t rc = ::write(wake_write.get(), &b, 1);
    (void)rc;  // a full pipe already holds a wake-up
  }

  void accept_loop() noexcept;
  void accept_one();
  /// Answers kBusy, with `reason`, on a connection over a limit; the accept thread closes it
  /// later.
  void refuse_busy(net::Socket sock, const std::string& reason);
  /// Serves an accepted connection, already counted in `active`, on a thread of its own.
  void start_connection(net::Socket sock);
  void reap_finished();
  /// Moves `c` out of Auth::kWaiting to `to`; false when it already left it.
  bool leave_waiting(Connection& c, Auth to) noexcept;
  /// Closes the oldest connection still waiting to authenticate whose HELLO has not arrived
  /// (none is waiting to be read); false when there is none such.
  bool displace_oldest_unauthenticated();
  /// Closes the oldest authenticated connection that stands for no rank and sits between
  /// requests (none is waiting to be read); false when there is none such.
  bool displace_idle_rankless();
  void serve(Connection& c);
  /// Reads `n` payload bytes in pieces as they arrive (NOTE [store memory bounds] 1), appending
  /// them to `out`, or discarding them where `out` is null.
  net::IoResult read_payload(int fd, std::size_t n, Deadline deadline, Bytes* out);
  void reject(Connection& c, wire::ReplyCode code, const std::string& reason);
  /// Counts and logs a request refused for want of room in flight (kRetryLater): a warning the
  /// first time on `c`, at debug level after that, since its client sends it again and again.
  void note_retry_later(Connection& c, const std::string& reason);
  bool handle(Connection& c, const wire::RequestHeader& h, const std::string& key, Bytes& value);
  /// Waits for `key`; with `out`, copies its value there, counted in `held`.
  WaitResult wait_for_key(int fd, const std::string& key, std::int64_t timeout_ms, Bytes* out,
                          Held& held);
  /// Why storing `value_bytes` under `key` (replacing what `it` points at, unless it is the
  /// end) would go over `max_keys` or `max_stored_bytes` (kOverLimit), else nullopt. Called
  /// with `data_mu` held.
  [[nodiscard]] std::optional<wire::Rejection> over_stored_limits(
      std::string_view op, const std::string& key,
      std::unordered_map<std::string, Bytes>::const_iterator it, std::size_t value_bytes) const;
  /// SET: stores `value` under `key` and wakes waiters; returns why it cannot, else nullopt.
  std::optional<wire::Rejection> set(const std::string& key, Bytes&& value);
  /// ADD: adds `delta` to the counter at `key` (created as 0), puts the new value in `result`
  /// and wakes waiters. Returns why it cannot (the key holds something else or the sum would
  /// overflow: kInvalidArgument; a new key would go over a limit: kOverLimit), else nullopt.
  std::optional<wire::Rejection> add(const std::string& key, std::int64_t delta,
                                     std::int64_t& result);
  /// Why this store takes no watch of `rank` at all (the job does not watch, its world size is
  /// unknown, or `rank` is past it), else nullopt.
  [[nodiscard]] std::optional<std::string> refuse_rank(std::int64_t rank) const;
  /// Why `rank`, in `slot`, cannot be claimed or watched again. Called with `data_mu` held.
  [[nodiscard]] std::string taken(std::int64_t rank, const RankSlot& slot) const;
  /// CLAIM: makes `c` stand for `rank` and puts the rank's watch secret in `secret`; returns
  /// why it cannot, else nullopt (NOTE [rank watch]).
  std::optional<std::string> claim(Connection& c, std::int64_t rank, Bytes& secret);
  /// Gives back the rank `c` claimed when no watch took it up (its connection ends).
  void release_claim(const Connection& c);
  /// Serves the watch connection of job rank `rank`, which presents `secret`, until the rank
  /// leaves, normally or not, or the server stops (NOTE [rank watch]). Returns false: the
  /// connection then closes.
  bool watch(Connection& c, std::int64_t rank, std::span<const std::byte> secret);
  /// Records the job's first lost rank; wakes every waiter.
  void mark_lost(std::int64_t rank, const std::string& reason);
  bool send_reply(int fd, const wire::ReplyHeader& h, std::span<const std::byte> payload);
  void stop() noexcept;
};

}  // namespace tpcomm
