// SPDX-License-Identifier: Apache-2.0
// The TCP store's server: one thread per connection, started and joined by an accept thread.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using detail::concat;
using net::Io;
using net::IoResult;
using net::Socket;
using std::chrono::milliseconds;
using wire::Opcode;
using wire::ReplyCode;

// How often a GET/WAIT that waits for its key checks whether its client hung up.
constexpr milliseconds kHangupPollInterval{100};
// After rejecting a frame the server stops sending and reads what the client still sends, for
// at most this long and this many bytes, before it closes: closing with unread input would
// reset the connection and could destroy the error reply before the client reads it.
constexpr milliseconds kRejectLinger{500};
constexpr std::size_t kRejectDrainBytes = std::size_t{1} << 20;
// Connections refused for being over `max_connections` are closed this long after the busy
// reply, by the accept thread, and at most this many are held open for that.
constexpr milliseconds kBusyLinger{500};
constexpr std::size_t kMaxBusyLingering = 64;
// How often a watch connection checks for a lost rank to report and for its client hanging up
// (NOTE [rank watch]); a lost rank reaches the other ranks within about this long.
constexpr milliseconds kWatchPoll{20};
// How long stop() gives the watch connections to send their stop notice.
constexpr milliseconds kWatchStopGrace{200};
// A connection still waiting to authenticate after this long may be displaced by a new one.
constexpr milliseconds kDisplaceAfter{1000};

// NOTE [store memory bounds]
// What clients can make the server hold is bounded:
// 1. A request's key and value are read in pieces of at most `kPiece` bytes as they arrive, so
//    a header that announces 64 MiB costs nothing until the bytes come.
// 2. Each piece, and the copy of a value that a GET replies with, is counted against
//    `max_inflight_bytes` (over all connections) before it is read or copied, and given back
//    when the request is stored or the reply sent. A request that finds no room is read to its
//    end and discarded; a GET that finds none is not copied; both are answered kOverLimit and
//    the connection stays open. One request is in flight per connection, so a connection holds
//    at most `max_key_bytes + max_value_bytes`.
// 3. A reply is sent in pieces; a client that does not take one within `kReplyStall` is
//    dropped (and counted as rejected), so a slow or stopped reader frees what it holds soon.
// 4. Stored keys and bytes are bounded by `max_keys` and `max_stored_bytes`.
constexpr std::size_t kPiece = std::size_t{64} << 10;
constexpr milliseconds kReplyStall{1000};

// Constant-time comparison, so the time a rejection takes says nothing about the token.
bool token_matches(std::span<const std::byte> given, std::string_view expected) noexcept {
  std::size_t n = std::max(given.size(), expected.size());
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    unsigned a = i < given.size() ? std::to_integer<unsigned>(given[i]) : 0u;
    unsigned b = i < expected.size() ? static_cast<unsigned char>(expected[i]) : 0u;
    diff |= a ^ b;
  }
  return diff == 0;
}

void set_nodelay(int fd) noexcept {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

struct TcpStoreServer::Impl {
  /// Where a connection is with authentication; it leaves kWaiting exactly once (a CAS), and
  /// whoever moves it out gives back its place in `unauthenticated`.
  enum class Auth { kWaiting, kDone, kDisplaced };
  struct Connection {
    Socket sock;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<Auth> auth{Auth::kWaiting};
    Deadline accepted = SteadyClock::now();
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
    Socket sock;
    Deadline close_at;
  };
  enum class WaitResult { kFound, kTimeout, kGone, kOverLimit, kRankLost };

  TcpStoreServerConfig config;
  wire::Limits limits;
  Socket listener;
  int port = 0;
  Socket wake_read;
  Socket wake_write;
  std::thread acceptor;

  std::atomic<bool> stopping{false};
  std::atomic<std::int64_t> rejected{0};
  std::atomic<int> waiting{0};
  std::atomic<int> watchers{0};
  std::atomic<std::size_t> inflight{0};

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
  // The ranks with a watch connection now: one each. Guarded by `data_mu`.
  std::unordered_set<std::int64_t> watched;
  std::size_t stored = 0;  // keys and values of `data`, in bytes

  // Connections: threads are started and joined by the accept thread (and by stop() once the
  // accept thread is gone). A connection's fd stays open until its thread has been joined, so
  // stop() can shut it down without racing a close and a reuse of the fd number.
  std::mutex conn_mu;
  std::list<std::unique_ptr<Connection>> conns;
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
  void refuse_busy(Socket sock, const std::string& reason);
  /// Serves an accepted connection, already counted in `active`, on a thread of its own.
  void start_connection(Socket sock);
  void reap_finished();
  /// Moves `c` out of Auth::kWaiting to `to`; false when it already left it.
  bool leave_waiting(Connection& c, Auth to) noexcept;
  /// Closes the oldest connection still waiting to authenticate, if it has waited
  /// `kDisplaceAfter`; false when there is none such.
  bool displace_oldest_unauthenticated();
  void serve(Connection& c);
  /// Reads `n` payload bytes, appending them to `out`, in pieces counted in `held` as they
  /// arrive (NOTE [store memory bounds] 1, 2). When a piece finds no room, sets `over_limit`,
  /// clears `out`, gives back `held` and reads the rest without keeping it.
  IoResult read_payload(int fd, std::size_t n, Deadline deadline, Held& held, Bytes& out,
                        bool& over_limit);
  void reject(Connection& c, ReplyCode code, const std::string& reason);
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
  /// Serves the watch connection of job rank `rank` until the rank leaves, normally or not, or
  /// the server stops (NOTE [rank watch]). Returns false: the connection then closes.
  bool watch(Connection& c, std::int64_t rank);
  /// Records the job's first lost rank; wakes every waiter.
  void mark_lost(std::int64_t rank, const std::string& reason);
  bool send_reply(int fd, const wire::ReplyHeader& h, std::span<const std::byte> payload);
  void stop() noexcept;
};

void TcpStoreServer::Impl::accept_loop() noexcept {
  while (!stopping.load()) {
    pollfd fds[2] = {{listener.get(), POLLIN, 0}, {wake_read.get(), POLLIN, 0}};
    int timeout = lingering.empty() ? -1 : static_cast<int>(kBusyLinger.count() / 5);
    int rc = ::poll(fds, 2, timeout);
    if (rc < 0 && errno != EINTR) {
      TPCOMM_LOG_ERROR("store: poll on the listening socket failed: ", std::strerror(errno));
      std::this_thread::sleep_for(milliseconds{100});
      continue;
    }
    if (rc > 0 && (fds[1].revents & POLLIN) != 0) {
      char buf[64];
      while (::read(wake_read.get(), buf, sizeof(buf)) > 0) {
      }
    }
    if (stopping.load()) break;
    reap_finished();
    auto now = SteadyClock::now();
    std::erase_if(lingering, [&](const Lingering& l) { return l.close_at <= now; });
    if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
      try {
        accept_one();
      } catch (const std::exception& e) {
        TPCOMM_LOG_ERROR("store: cannot serve a new connection: ", e.what());
      }
    }
  }
}

void TcpStoreServer::Impl::accept_one() {
  int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      TPCOMM_LOG_WARN("store: accept: ", std::strerror(errno));
      // The pending connection stays queued; pause rather than spin on it.
      std::this_thread::sleep_for(milliseconds{100});
    }
    return;
  }
  Socket sock(fd);
  set_nodelay(fd);
  // A connection over either limit displaces the oldest one still waiting to authenticate,
  // when that one has waited `kDisplaceAfter` (a client sends HELLO as soon as it connects),
  // else it is refused as busy, which clients retry. So connections that never say HELLO cannot
  // keep a client with the token out, and a crowd of clients connecting at once is slowed, not
  // cut off. Only this thread adds to the counts; a displaced connection still counts until its
  // thread ends, so `active` may exceed `max_connections` by those for a moment.
  bool waiting_full;
  bool full;
  {
    std::lock_guard lock(count_mu);
    waiting_full = unauthenticated >= config.max_unauthenticated;
    full = active >= config.max_connections;
  }
  if ((waiting_full || full) && !displace_oldest_unauthenticated()) {
    return refuse_busy(
        std::move(sock),
        waiting_full
            ? concat("the store has its maximum of ", config.max_unauthenticated,
                     " connections waiting to authenticate")
            : concat("the store serves its maximum of ", config.max_connections, " connections"));
  }
  {
    std::lock_guard lock(count_mu);
    ++active;
    ++unauthenticated;
  }
  start_connection(std::move(sock));
}

bool TcpStoreServer::Impl::leave_waiting(Connection& c, Auth to) noexcept {
  Auth expected = Auth::kWaiting;
  if (!c.auth.compare_exchange_strong(expected, to)) return false;
  std::lock_guard lock(count_mu);
  --unauthenticated;
  return true;
}

bool TcpStoreServer::Impl::displace_oldest_unauthenticated() {
  std::lock_guard lock(conn_mu);
  // `conns` is in the order of acceptance: the first one waiting is the oldest.
  for (auto& c : conns) {
    if (c->auth.load() != Auth::kWaiting) continue;
    if (SteadyClock::now() - c->accepted < kDisplaceAfter) return false;
    if (!leave_waiting(*c, Auth::kDisplaced)) continue;
    rejected.fetch_add(1);
    TPCOMM_LOG_WARN("store: closed the connection from ", c->peer,
                    " before it authenticated, to make room for a new one (max_unauthenticated ",
                    config.max_unauthenticated, ", max_connections ", config.max_connections, ")");
    // The fd stays open until the thread is joined (see `conns`): this cannot hit a reused fd.
    ::shutdown(c->sock.get(), SHUT_RDWR);
    return true;
  }
  return false;
}

void TcpStoreServer::Impl::refuse_busy(Socket sock, const std::string& reason) {
  const int fd = sock.get();
  TPCOMM_LOG_WARN("store: refused a connection from ", net::peer_name(fd), ": ", reason);
  wire::ReplyHeader h{.code = ReplyCode::kBusy, .value_len = reason.size()};
  auto hb = wire::encode(h);
  Deadline d = deadline_after(milliseconds{100});
  if (net::send_all(fd, hb, d).status == Io::kOk) net::send_all(fd, wire::as_bytes(reason), d);
  ::shutdown(fd, SHUT_WR);
  if (lingering.size() >= kMaxBusyLingering) lingering.erase(lingering.begin());
  lingering.push_back({std::move(sock), deadline_after(kBusyLinger)});
}

void TcpStoreServer::Impl::start_connection(Socket sock) {
  const int fd = sock.get();
  auto c = std::make_unique<Connection>();
  c->sock = std::move(sock);
  c->peer = net::peer_name(fd);
  Connection* raw = c.get();
  {
    std::lock_guard lock(conn_mu);
    conns.push_back(std::move(c));
  }
  try {
    raw->thread = std::thread([this, raw] {
      try {
        serve(*raw);
      } catch (const std::exception& e) {
        TPCOMM_LOG_ERROR("store: connection from ", raw->peer, " failed: ", e.what());
      }
      // The client sees the end of the stream now; the fd is closed when the thread is joined.
      ::shutdown(raw->sock.get(), SHUT_RDWR);
      leave_waiting(*raw, Auth::kDone);
      raw->done.store(true);
      {
        std::lock_guard lock(count_mu);
        --active;
      }
      count_cv.notify_all();
      wake();
    });
  } catch (...) {
    leave_waiting(*raw, Auth::kDone);
    {
      std::lock_guard lock(conn_mu);
      conns.pop_back();
    }
    {
      std::lock_guard lock(count_mu);
      --active;
    }
    count_cv.notify_all();
    throw;
  }
}

void TcpStoreServer::Impl::reap_finished() {
  std::list<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard lock(conn_mu);
    for (auto it = conns.begin(); it != conns.end();) {
      if ((*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished) c->thread.join();
}

bool TcpStoreServer::Impl::send_reply(int fd, const wire::ReplyHeader& h,
                                      std::span<const std::byte> payload) {
  // NOTE [store memory bounds] 3: every piece must be taken within `kReplyStall`.
  const Deadline whole = deadline_after(config.frame_timeout);
  auto piece_deadline = [&] { return std::min(whole, deadline_after(kReplyStall)); };
  auto hb = wire::encode(h);
  IoResult r = net::send_all(fd, hb, piece_deadline());
  for (std::size_t sent = 0; r.status == Io::kOk && sent < payload.size(); sent += kPiece) {
    r = net::send_all(fd, payload.subspan(sent, std::min(kPiece, payload.size() - sent)),
                      piece_deadline());
  }
  if (r.status == Io::kTimeout) {
    rejected.fetch_add(1);
    TPCOMM_LOG_WARN("store: dropped the connection from ", net::peer_name(fd),
                    ": it did not read its reply of ", payload.size(), " bytes");
  }
  return r.status == Io::kOk;
}

IoResult TcpStoreServer::Impl::read_payload(int fd, std::size_t n, Deadline deadline, Held& held,
                                            Bytes& out, bool& over_limit) {
  std::array<std::byte, kPiece> piece;
  IoResult total;
  while (n > 0) {
    const std::size_t k = std::min(n, piece.size());
    if (!over_limit && !held.take(k)) {
      over_limit = true;
      held.release();
      Bytes().swap(out);
    }
    IoResult r = net::recv_all(fd, std::span(piece.data(), k), deadline);
    total.bytes += r.bytes;
    if (r.status != Io::kOk) {
      r.bytes = total.bytes;
      return r;
    }
    if (!over_limit) out.insert(out.end(), piece.begin(), piece.begin() + static_cast<long>(k));
    n -= k;
  }
  return total;
}

void TcpStoreServer::Impl::reject(Connection& c, ReplyCode code, const std::string& reason) {
  rejected.fetch_add(1);
  TPCOMM_LOG_WARN("store: rejected a frame from ", c.peer, ": ", reason,
                  "; closing that connection");
  const int fd = c.sock.get();
  std::string text = reason.substr(0, wire::kMaxReasonBytes);
  wire::ReplyHeader h{.code = code, .value_len = text.size()};
  Deadline d = deadline_after(std::min(config.frame_timeout, kRejectLinger));
  auto hb = wire::encode(h);
  if (net::send_all(fd, hb, d).status == Io::kOk) net::send_all(fd, wire::as_bytes(text), d);
  ::shutdown(fd, SHUT_WR);
  std::byte sink[4096];
  std::size_t drained = 0;
  while (drained < kRejectDrainBytes && !stopping.load()) {
    if (net::wait_readable(fd, d).status != Io::kOk) break;
    ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    if (n > 0) drained += static_cast<std::size_t>(n);
  }
}

TcpStoreServer::Impl::WaitResult TcpStoreServer::Impl::wait_for_key(int fd, const std::string& key,
                                                                    std::int64_t timeout_ms,
                                                                    Bytes* out, Held& held) {
  const Deadline deadline = deadline_after(milliseconds{timeout_ms});
  waiting.fetch_add(1);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{waiting};
  std::unique_lock lock(data_mu);
  Deadline next_poll = SteadyClock::now() + kHangupPollInterval;
  for (;;) {
    if (auto it = data.find(key); it != data.end()) {
      if (out == nullptr) return WaitResult::kFound;
      if (!held.take(it->second.size())) return WaitResult::kOverLimit;
      *out = it->second;
      return WaitResult::kFound;
    }
    if (stopping.load()) return WaitResult::kGone;
    if (!lost.empty()) return WaitResult::kRankLost;
    const auto now = SteadyClock::now();
    if (now >= deadline) return WaitResult::kTimeout;
    if (now >= next_poll) {
      // A client that died while waiting must not pin this thread until the timeout.
      lock.unlock();
      const bool gone = net::peer_hung_up(fd);
      lock.lock();
      if (gone) return WaitResult::kGone;
      next_poll = now + kHangupPollInterval;
      continue;
    }
    data_cv.wait_until(lock, std::min(deadline, next_poll));
  }
}

std::optional<wire::Rejection> TcpStoreServer::Impl::over_stored_limits(
    std::string_view op, const std::string& key,
    std::unordered_map<std::string, Bytes>::const_iterator it, std::size_t value_bytes) const {
  const bool is_new = it == data.end();
  if (is_new && data.size() >= config.max_keys) {
    return wire::Rejection{ReplyCode::kOverLimit,
                           concat(op, " of a new key: the store holds its max_keys of ",
                                  config.max_keys, " keys; key '", key, "'")};
  }
  const std::size_t freed = is_new ? 0 : key.size() + it->second.size();
  const std::size_t needed = key.size() + value_bytes;
  if (needed > config.max_stored_bytes - (stored - freed)) {
    return wire::Rejection{
        ReplyCode::kOverLimit,
        concat(op, " of ", needed, " bytes (key and value) would take the store over its ",
               "max_stored_bytes of ", config.max_stored_bytes, " (it holds ", stored, "); key '",
               key, "'")};
  }
  return std::nullopt;
}

std::optional<wire::Rejection> TcpStoreServer::Impl::set(const std::string& key, Bytes&& value) {
  {
    std::lock_guard lock(data_mu);
    auto it = data.find(key);
    if (auto why = over_stored_limits("SET", key, it, value.size())) return why;
    if (it == data.end()) {
      stored += key.size() + value.size();
      data.emplace(key, std::move(value));
    } else {
      stored = stored - it->second.size() + value.size();
      it->second = std::move(value);
    }
  }
  data_cv.notify_all();
  return std::nullopt;
}

std::optional<wire::Rejection> TcpStoreServer::Impl::add(const std::string& key, std::int64_t delta,
                                                         std::int64_t& result) {
  std::string error;
  {
    std::lock_guard lock(data_mu);
    auto it = data.find(key);
    const bool inserted = it == data.end();
    if (inserted) {
      if (auto why = over_stored_limits("ADD", key, it, sizeof(std::int64_t))) return why;
      it = data.try_emplace(key).first;
      stored += key.size();
    }
    std::optional<std::int64_t> current =
        inserted ? std::optional<std::int64_t>(0) : wire::decode_counter(it->second);
    if (!current) {
      error = concat("ADD on key '", key, "', which holds a value of ", it->second.size(),
                     " bytes, not a counter (8 bytes)");
    } else if (std::int64_t sum = 0; __builtin_add_overflow(*current, delta, &sum)) {
      error = concat("ADD of ", delta, " to key '", key, "', which holds ", *current,
                     ", overflows a 64-bit counter (the counter is unchanged)");
    } else {
      result = sum;
      auto bytes = wire::encode_counter(result);
      stored = stored - it->second.size() + bytes.size();
      it->second.assign(bytes.begin(), bytes.end());
    }
  }
  if (!error.empty()) return wire::Rejection{ReplyCode::kInvalidArgument, error};
  data_cv.notify_all();
  return std::nullopt;
}

bool TcpStoreServer::Impl::handle(Connection& c, const wire::RequestHeader& h,
                                  const std::string& key, Bytes& value) {
  const int fd = c.sock.get();
  wire::ReplyHeader reply;
  Bytes payload;
  Held held(*this);
  // An error reply's reason, cut to what a client accepts (it may quote a long key).
  auto fail = [&](ReplyCode code, const std::string& reason) {
    if (code == ReplyCode::kOverLimit) {
      rejected.fetch_add(1);
      TPCOMM_LOG_WARN("store: refused a request from ", c.peer, ": ", reason);
    }
    reply.code = code;
    const std::size_t n = std::min(reason.size(), wire::kMaxReasonBytes);
    payload.resize(n);
    std::memcpy(payload.data(), reason.data(), n);
  };
  switch (h.opcode) {
    case Opcode::kSet: {
      if (auto why = set(key, std::move(value))) fail(why->code, why->reason);
      break;
    }
    case Opcode::kGet:
    case Opcode::kWait: {
      Bytes* out = h.opcode == Opcode::kGet ? &payload : nullptr;
      switch (wait_for_key(fd, key, h.arg, out, held)) {
        case WaitResult::kFound:
          break;
        case WaitResult::kTimeout:
          reply.code = ReplyCode::kTimeout;
          break;
        case WaitResult::kGone:
          return false;
        case WaitResult::kOverLimit:
          fail(ReplyCode::kOverLimit,
               concat("GET '", key, "': its value would take the bytes the store holds in flight ",
                      "over its max_inflight_bytes of ", config.max_inflight_bytes,
                      "; try again later"));
          break;
        case WaitResult::kRankLost: {
          std::string reason;
          {
            std::lock_guard lock(data_mu);
            reason = lost;
          }
          fail(ReplyCode::kRankLost, reason);
          break;
        }
      }
      break;
    }
    case Opcode::kAdd: {
      if (auto why = add(key, h.arg, reply.result)) fail(why->code, why->reason);
      break;
    }
    case Opcode::kCheck: {
      std::lock_guard lock(data_mu);
      reply.result = data.contains(key) ? 1 : 0;
      break;
    }
    case Opcode::kErase: {
      std::lock_guard lock(data_mu);
      if (auto it = data.find(key); it != data.end()) {
        stored -= key.size() + it->second.size();
        data.erase(it);
        reply.result = 1;
      }
      break;
    }
    case Opcode::kWatch:
      return watch(c, h.arg);
    case Opcode::kHello:
      break;
  }
  reply.value_len = payload.size();
  return send_reply(fd, reply, payload);
}

void TcpStoreServer::Impl::mark_lost(std::int64_t rank, const std::string& reason) {
  {
    std::lock_guard lock(data_mu);
    if (!lost.empty()) return;
    lost = reason;
    lost_rank = rank;
  }
  TPCOMM_LOG_WARN("store: ", reason, "; waits for keys fail from now on");
  data_cv.notify_all();
}

bool TcpStoreServer::Impl::watch(Connection& c, std::int64_t rank) {
  const int fd = c.sock.get();
  if (rank < 0) {
    reject(c, ReplyCode::kProtocolError, "WATCH -1 (leaving) on a connection that watches no rank");
    return false;
  }
  // A watch that is not a rank of the job, or of a rank watched already, is refused: closing it
  // then loses nothing (NOTE [rank watch]).
  if (config.world_size > 0 && rank >= config.world_size) {
    reject(c, ReplyCode::kProtocolError,
           concat("WATCH ", rank, ": the job has ", config.world_size, " ranks"));
    return false;
  }
  bool first = false;
  {
    std::lock_guard lock(data_mu);
    first = watched.insert(rank).second;
  }
  if (!first) {
    reject(c, ReplyCode::kProtocolError,
           concat("WATCH ", rank, ": rank ", rank, " has a watch connection already"));
    return false;
  }
  watchers.fetch_add(1);
  struct Leave {
    Impl& m;
    std::int64_t rank;
    ~Leave() {
      m.watchers.fetch_sub(1);
      std::lock_guard lock(m.data_mu);
      m.watched.erase(rank);
    }
  } leave{*this, rank};
  if (!send_reply(fd, wire::ReplyHeader{}, {})) return false;
  TPCOMM_LOG_DEBUG("store: ", c.peer, " watches as rank ", rank);
  bool told = false;
  for (;;) {
    std::string notice;
    std::int64_t notice_rank = -1;
    if (!told) {
      std::lock_guard lock(data_mu);
      if (!lost.empty() && lost_rank != rank) {
        notice = lost;
        notice_rank = lost_rank;
        told = true;
      }
    }
    if (!notice.empty()) {
      // A failed send means the client is gone too: the next poll sees it.
      send_reply(
          fd,
          wire::ReplyHeader{
              .code = ReplyCode::kRankLost, .value_len = notice.size(), .result = notice_rank},
          wire::as_bytes(notice));
    }
    if (stopping.load()) {
      send_reply(fd, wire::ReplyHeader{.result = -1}, {});  // a normal end, not a lost host
      return false;
    }
    IoResult w = net::wait_readable(fd, deadline_after(kWatchPoll));
    if (w.status == Io::kTimeout) continue;
    wire::RequestBytes hb;
    IoResult r =
        w.status == Io::kOk ? net::recv_all(fd, hb, deadline_after(config.frame_timeout)) : w;
    if (stopping.load()) return false;
    if (r.status != Io::kOk) {
      mark_lost(rank, concat("rank ", rank, " left: its connection to the store closed"));
      return false;
    }
    const wire::RequestHeader h = wire::decode_request(hb);
    if (!wire::check_request(h, limits) && h.opcode == Opcode::kWatch && h.arg == -1) {
      TPCOMM_LOG_DEBUG("store: rank ", rank, " left normally");
      return false;
    }
    reject(c, ReplyCode::kProtocolError, "a watch connection sends nothing but WATCH -1");
    return false;
  }
}

void TcpStoreServer::Impl::serve(Connection& c) {
  const int fd = c.sock.get();
  const auto frame_ms = config.frame_timeout.count();
  bool authenticated = false;
  // NOTE [store wire format] 1: HELLO must come first, and within `hello_timeout` of the
  // connection, so silent connections cannot hold threads.
  const Deadline hello_deadline = deadline_after(config.hello_timeout);
  while (!stopping.load()) {
    IoResult w = net::wait_readable(fd, authenticated ? kNoDeadline : hello_deadline);
    if (stopping.load() || w.status == Io::kError) return;
    if (w.status == Io::kTimeout) {
      return reject(c, ReplyCode::kUnauthenticated,
                    concat("no HELLO within ", config.hello_timeout.count(), " ms of connecting"));
    }
    if (c.auth.load() == Auth::kDisplaced) return;
    const Deadline frame_deadline =
        authenticated ? deadline_after(config.frame_timeout)
                      : std::min(hello_deadline, deadline_after(config.frame_timeout));
    wire::RequestBytes hb;
    IoResult r = net::recv_all(fd, hb, frame_deadline);
    if (r.status != Io::kOk) {
      if (stopping.load() || (r.status == Io::kClosed && r.bytes == 0)) return;  // clean close
      return reject(c, ReplyCode::kProtocolError,
                    r.status == Io::kTimeout
                        ? concat("frame incomplete after ", frame_ms, " ms (", r.bytes, " of ",
                                 hb.size(), " header bytes)")
                        : concat("frame cut off after ", r.bytes, " of ", hb.size(),
                                 " header bytes: ", net::describe(r)));
    }
    const wire::RequestHeader h = wire::decode_request(hb);
    // NOTE [store wire format] 2: nothing of the payload is read or allocated before this.
    if (auto why = wire::check_request(h, limits)) return reject(c, why->code, why->reason);
    if (!authenticated && h.opcode != Opcode::kHello) {
      return reject(c, ReplyCode::kUnauthenticated,
                    concat("the first request must be HELLO, got ", wire::to_string(h.opcode)));
    }
    if (authenticated && h.opcode == Opcode::kHello) {
      return reject(c, ReplyCode::kProtocolError, "HELLO sent twice");
    }
    // NOTE [store memory bounds] 1, 2: the payload is read as it arrives, and counted.
    Held key_held(*this);
    Held value_held(*this);
    Bytes key_bytes;
    Bytes value;
    bool over_limit = false;
    r = read_payload(fd, h.key_len, frame_deadline, key_held, key_bytes, over_limit);
    if (r.status == Io::kOk) {
      r = read_payload(fd, h.value_len, frame_deadline, value_held, value, over_limit);
    }
    if (r.status != Io::kOk) {
      if (stopping.load() || c.auth.load() == Auth::kDisplaced) return;
      return reject(
          c, ReplyCode::kProtocolError,
          concat(wire::to_string(h.opcode), " frame of ", h.key_len + h.value_len,
                 " payload bytes ", r.status == Io::kTimeout ? "incomplete after " : "cut off: ",
                 r.status == Io::kTimeout ? concat(frame_ms, " ms") : net::describe(r)));
    }
    const std::string key(reinterpret_cast<const char*>(key_bytes.data()), key_bytes.size());
    if (over_limit) {
      const std::string reason =
          concat(wire::to_string(h.opcode), " of ", h.key_len + h.value_len,
                 " payload bytes would take the bytes the store holds in flight over its ",
                 "max_inflight_bytes of ", config.max_inflight_bytes, "; try again later");
      if (h.opcode == Opcode::kHello) return reject(c, ReplyCode::kOverLimit, reason);
      rejected.fetch_add(1);
      TPCOMM_LOG_WARN("store: refused a frame from ", c.peer, ": ", reason);
      const wire::ReplyHeader over{.code = ReplyCode::kOverLimit, .value_len = reason.size()};
      if (!send_reply(fd, over, wire::as_bytes(reason))) return;
      continue;
    }
    if (h.opcode == Opcode::kHello) {
      if (!token_matches(value, config.token)) {
        return reject(c, ReplyCode::kUnauthenticated,
                      value.empty() ? "this store requires a token" : "wrong token");
      }
      // A connection displaced meanwhile (see `accept_one`) is closed: it lost its place.
      if (!leave_waiting(c, Auth::kDone)) return;
      authenticated = true;
      if (!send_reply(fd, wire::ReplyHeader{.result = wire::kVersion}, {})) return;
      continue;
    }
    if (!handle(c, h, key, value)) return;
  }
}

void TcpStoreServer::Impl::stop() noexcept {
  std::lock_guard guard(stop_mu);
  if (stopped) return;
  stopped = true;
  stopping.store(true);
  wake();
  if (acceptor.joinable()) acceptor.join();
  // Watch connections tell their clients that this is a normal end (NOTE [rank watch]).
  for (const Deadline grace = deadline_after(kWatchStopGrace);
       watchers.load() > 0 && SteadyClock::now() < grace;)
    std::this_thread::sleep_for(milliseconds{2});
  std::list<std::unique_ptr<Connection>> all;
  {
    std::lock_guard lock(conn_mu);
    all.swap(conns);
  }
  for (auto& c : all) ::shutdown(c->sock.get(), SHUT_RDWR);
  {
    // Taking the lock orders this notification after a waiter's check of `stopping`.
    std::lock_guard lock(data_mu);
  }
  data_cv.notify_all();
  for (auto& c : all)
    if (c->thread.joinable()) c->thread.join();
  all.clear();
  lingering.clear();
  listener.reset();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerConfig config) : impl_(std::make_unique<Impl>()) {
  TPCOMM_CHECK(config.max_connections > 0, Status::kInvalidArgument,
               "max_connections must be positive, got ", config.max_connections);
  TPCOMM_CHECK(config.max_unauthenticated > 0, Status::kInvalidArgument,
               "max_unauthenticated must be positive, got ", config.max_unauthenticated);
  TPCOMM_CHECK(config.frame_timeout.count() > 0, Status::kInvalidArgument,
               "frame_timeout must be positive");
  TPCOMM_CHECK(config.hello_timeout.count() > 0, Status::kInvalidArgument,
               "hello_timeout must be positive");
  TPCOMM_CHECK(config.max_value_bytes <= config.max_inflight_bytes &&
                   config.max_key_bytes <= config.max_inflight_bytes - config.max_value_bytes,
               Status::kInvalidArgument, "max_inflight_bytes (", config.max_inflight_bytes,
               ") is less than max_key_bytes + max_value_bytes (", config.max_key_bytes, " + ",
               config.max_value_bytes, "): the largest request could never be read");
  TPCOMM_CHECK(config.token.size() <= wire::kMaxTokenBytes, Status::kInvalidArgument,
               "the store token is longer than ", wire::kMaxTokenBytes, " bytes");
  Impl& m = *impl_;
  m.config = std::move(config);
  m.limits = {m.config.max_key_bytes, m.config.max_value_bytes};
  m.listener = net::listen_tcp(m.config.bind, m.config.port);
  m.port = net::local_port(m.listener.get());
  int p[2];
  TPCOMM_CHECK(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0, Status::kSystemError,
               "pipe2: ", std::strerror(errno));
  m.wake_read.reset(p[0]);
  m.wake_write.reset(p[1]);
  m.acceptor = std::thread([&m] { m.accept_loop(); });
  TPCOMM_LOG_INFO("store: serving on ", net::join_host_port(m.config.bind, m.port),
                  m.config.token.empty() ? " without a token" : " with a token");
}

TcpStoreServer::~TcpStoreServer() { stop(); }

int TcpStoreServer::port() const noexcept { return impl_->port; }

std::int64_t TcpStoreServer::rejected_frames() const noexcept { return impl_->rejected.load(); }

int TcpStoreServer::connections() const noexcept {
  std::lock_guard lock(impl_->count_mu);
  return impl_->active;
}

int TcpStoreServer::waiting() const noexcept { return impl_->waiting.load(); }

std::size_t TcpStoreServer::inflight_bytes() const noexcept { return impl_->inflight.load(); }

std::size_t TcpStoreServer::stored_bytes() const noexcept {
  std::lock_guard lock(impl_->data_mu);
  return impl_->stored;
}

bool TcpStoreServer::wait_idle(Milliseconds timeout) {
  std::unique_lock lock(impl_->count_mu);
  return impl_->count_cv.wait_until(lock, deadline_after(timeout),
                                    [&] { return impl_->active == 0; });
}

void TcpStoreServer::stop() noexcept { impl_->stop(); }

}  // namespace tpcomm
