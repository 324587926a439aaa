// SPDX-License-Identifier: Apache-2.0
// The TCP store's client: one connection, one request in flight, optionally hosting the server.
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "bootstrap/deadline.hpp"
#include "bootstrap/rank_watch.hpp"
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

// Beyond a GET/WAIT's own timeout, how long the client waits for the server's reply (the
// server answers kTimeout at the timeout; this covers the round trip).
constexpr milliseconds kReplySlack{2000};
// A GET or WAIT waits on the server in slices of at most this long, the connection free between
// them: threads that share one client (ranks of one process) take turns with a waiting one
// instead of queueing behind it until its timeout.
constexpr milliseconds kWaitSlice{250};

}  // namespace

struct TcpStore::Impl {
  Config config;
  std::unique_ptr<TcpStoreServer> server;
  std::string address;  // host:port, for messages
  int port = 0;
  wire::Limits limits;
  // One request in flight per connection (NOTE [store wire format] 4); a caller waits for its
  // turn no longer than its own deadline. `queued` counts the callers waiting for `mu`, `turns`
  // the times it was taken: a waiting GET lets the queued ones go first (the mutex alone would
  // let it take the connection straight back).
  std::timed_mutex mu;
  std::atomic<int> queued{0};
  std::atomic<std::uint64_t> turns{0};
  Socket sock;
  // Why the connection cannot be used any more; empty while it can.
  std::string broken;
  // NOTE [rank watch]: the watch connection, read by `watcher` alone.
  std::shared_ptr<RankWatch> rank_watch;
  Bytes watch_secret;  // what this rank's CLAIM returned; its watch presents it
  Socket watch_sock;
  std::thread watcher;
  std::atomic<bool> leaving{false};

  struct Reply {
    wire::ReplyHeader header;
    Bytes value;
  };

  void check_key(std::string_view what, std::string_view key) const {
    TPCOMM_CHECK(!key.empty(), Status::kInvalidArgument, what, ": empty key");
    TPCOMM_CHECK(key.size() <= limits.max_key_bytes, Status::kInvalidArgument, what, ": key of ",
                 key.size(), " bytes is longer than the limit of ", limits.max_key_bytes);
  }

  /// True for what ends a handshake (HELLO, the watch's claim) that is tried again: the server
  /// busy, or the connection lost (a server closes one that has not said HELLO yet to make room
  /// for a new one). Not a refusal of the token, nor a protocol error.
  static bool retry_handshake(const Error& e) noexcept {
    return e.status() == Status::kUnavailable || e.status() == Status::kSystemError;
  }

  [[noreturn]] void fail_io(const std::string& what, const IoResult& r, milliseconds waited) {
    broken = net::describe(r);
    if (r.status == Io::kTimeout) {
      TPCOMM_THROW(Status::kTimeout, what, ": no reply from the store at ", address, " within ",
                   waited.count(), " ms");
    }
    TPCOMM_THROW(Status::kSystemError, what, ": connection to the store at ", address,
                 " lost: ", broken);
  }

  // Sends one request and reads its reply; throws for every reply but kOk. `timeout` is the
  // operation's timeout as the caller gave it (for messages); `io_deadline` bounds the I/O.
  // With `timeout_ok`, a kTimeout reply (a GET or WAIT's key not set in time) is returned, not
  // thrown.
  Reply call(const std::string& what, Opcode op, std::string_view key,
             std::span<const std::byte> value, std::int64_t arg, Deadline io_deadline,
             milliseconds timeout, bool timeout_ok = false) {
    std::unique_lock lock(mu, std::defer_lock);
    ++queued;
    const bool locked = lock.try_lock_until(io_deadline);
    --queued;
    if (!locked) {
      TPCOMM_THROW(Status::kTimeout, what, ": another operation on the connection to ", address,
                   " did not finish within ", timeout.count(), " ms");
    }
    if (!broken.empty()) {
      TPCOMM_THROW(Status::kSystemError, what, ": the connection to the store at ", address,
                   " is unusable since an earlier failure: ", broken);
    }
    ++turns;
    const auto started = SteadyClock::now();
    wire::RequestHeader h{.opcode = op,
                          .key_len = static_cast<std::uint32_t>(key.size()),
                          .value_len = value.size(),
                          .arg = arg};
    // NOTE [store wire format] 5: a large value is sent only after the server's go-ahead.
    const bool go_ahead = wire::awaits_go_ahead(h);
    const std::span<const std::byte> eager = go_ahead ? std::span<const std::byte>{} : value;
    auto hb = wire::encode(h);
    Bytes frame(hb.size() + key.size() + eager.size());
    std::memcpy(frame.data(), hb.data(), hb.size());
    if (!key.empty()) std::memcpy(frame.data() + hb.size(), key.data(), key.size());
    if (!eager.empty())
      std::memcpy(frame.data() + hb.size() + key.size(), eager.data(), eager.size());
    auto waited = [&] {
      return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - started);
    };
    auto send = [&](std::span<const std::byte> bytes) {
      IoResult r = net::send_all(sock.get(), bytes, io_deadline);
      if (r.status != Io::kOk) fail_io(what, r, waited());
    };
    auto receive = [&](bool go_ahead_ok) {
      wire::ReplyBytes rb;
      IoResult r = net::recv_all(sock.get(), rb, io_deadline);
      if (r.status != Io::kOk) fail_io(what, r, waited());
      Reply reply{wire::decode_reply(rb), {}};
      std::optional<std::string> why = wire::check_reply(reply.header, limits.max_value_bytes);
      if (!why && !go_ahead_ok && reply.header.code == ReplyCode::kGoAhead)
        why = "a go-ahead for a request that awaits none";
      if (why) {
        broken = *why;
        TPCOMM_THROW(Status::kProtocolError, what, ": malformed reply from ", address, ": ", *why);
      }
      reply.value.resize(reply.header.value_len);
      r = net::recv_all(sock.get(), reply.value, io_deadline);
      if (r.status != Io::kOk) fail_io(what, r, waited());
      return reply;
    };
    // A request over the bytes the server holds in flight was not applied: it is sent again,
    // after a growing pause, while another attempt as long as the last one (twice over) still
    // fits before the deadline (other requests give their bytes back); then the refusal is the
    // answer, and the connection stays usable (an attempt cut off by the deadline would break
    // it in the middle of a frame). An attempt refused before its go-ahead sent no value.
    for (milliseconds pause{1};; pause = std::min(pause * 2, milliseconds{50})) {
      const auto attempt = SteadyClock::now();
      send(frame);
      Reply reply = receive(go_ahead);
      if (reply.header.code == ReplyCode::kGoAhead) {
        send(value);
        reply = receive(false);
      }
      if (reply.header.code == ReplyCode::kOk) return reply;
      if (timeout_ok && reply.header.code == ReplyCode::kTimeout) return reply;
      const auto now = SteadyClock::now();
      const bool retry = reply.header.code == ReplyCode::kOverLimit &&
                         reply.header.result == wire::kRetryLater &&
                         now + pause + 2 * (now - attempt) < io_deadline;
      if (!retry) fail_reply(what, reply, timeout);
      std::this_thread::sleep_for(pause);
    }
  }

  // A GET (`op` kGet) or WAIT of `key` until `deadline`, in slices of `kWaitSlice` (the
  // connection free between them); throws kTimeout naming `timeout` when the key is not set by
  // then.
  Reply wait_for(const std::string& what, Opcode op, std::string_view key, Deadline deadline,
                 milliseconds timeout) {
    for (;;) {
      const milliseconds slice = std::min(remaining(deadline), kWaitSlice);
      // The server answers at the slice's end, but a loaded one (a thousand ranks on a few
      // cores) may answer later: the reply is awaited until the whole wait's deadline (and the
      // slack), so that a late one does not break the connection.
      Reply reply = call(what, op, key, {}, slice.count(),
                         std::max(deadline_after(slice), deadline) + kReplySlack, timeout,
                         /*timeout_ok=*/true);
      if (reply.header.code == ReplyCode::kOk) return reply;
      if (SteadyClock::now() >= deadline) fail_reply(what, reply, timeout);
      // Let the threads that wait for the connection take it before the next slice.
      const std::uint64_t seen = turns.load();
      while (queued.load() > 0 && turns.load() == seen && SteadyClock::now() < deadline)
        std::this_thread::sleep_for(milliseconds{1});
    }
  }

  // Throws for an error reply, marking the connection unusable when the server closes it.
  [[noreturn]] void fail_reply(const std::string& what, const Reply& reply, milliseconds timeout) {
    const std::string reason(reinterpret_cast<const char*>(reply.value.data()), reply.value.size());
    switch (reply.header.code) {
      case ReplyCode::kTimeout:
        TPCOMM_THROW(Status::kTimeout, what, ": key not set within ", timeout.count(), " ms");
      case ReplyCode::kInvalidArgument:
        TPCOMM_THROW(Status::kInvalidArgument, what, ": ", reason);
      case ReplyCode::kTooLarge:
        broken = reason;
        TPCOMM_THROW(Status::kInvalidArgument, what, ": the store at ", address,
                     " refused the request: ", reason);
      case ReplyCode::kUnauthenticated:
        broken = reason;
        TPCOMM_THROW(Status::kInvalidArgument, what, ": the store at ", address,
                     " refused this client: ", reason,
                     " (every rank must use the job's TPCOMM_STORE_TOKEN)");
      case ReplyCode::kOverLimit:
        TPCOMM_THROW(Status::kUnavailable, what, ": the store at ", address,
                     " is at a limit: ", reason);
      case ReplyCode::kBusy:
        broken = reason;
        TPCOMM_THROW(Status::kUnavailable, what, ": the store at ", address,
                     " refused the connection: ", reason);
      case ReplyCode::kRankLost:
        TPCOMM_THROW(Status::kAborted, what, ": ", reason);
      case ReplyCode::kRefused:
        TPCOMM_THROW(Status::kInvalidArgument, what, ": the store at ", address,
                     " refused: ", reason);
      default:
        broken = reason;
        TPCOMM_THROW(Status::kProtocolError, what, ": the store at ", address,
                     " reported a protocol error: ", reason);
    }
  }

  // Claims job rank `rank` over the request connection, then connects a second time and
  // registers that as the rank's watch connection with the secret the claim returned; a thread
  // then reads its notices (NOTE [rank watch]).
  // A server at its connection limit answers "busy", or closes a connection whose HELLO it has
  // not read yet to make room: the watch is retried, with a growing pause, until the deadline,
  // like the first connection.
  void start_watch(const std::string& host, int rank, Deadline deadline) {
    watch_secret = call(concat("store claim of rank ", rank), Opcode::kClaim, {}, {}, rank,
                        std::max(deadline, deadline_after(milliseconds{1000})), config.timeout)
                       .value;
    for (milliseconds pause{10};; pause = std::min(2 * pause, milliseconds{500})) {
      try {
        claim_watch(host, rank, deadline);
        break;
      } catch (const Error& e) {
        watch_sock.reset();
        if (!retry_handshake(e) || SteadyClock::now() >= deadline) throw;
        std::this_thread::sleep_for(
            std::min<SteadyClock::duration>(pause, deadline - SteadyClock::now()));
        if (SteadyClock::now() >= deadline) throw;
      }
    }
    rank_watch = std::make_shared<RankWatch>();
    watcher = std::thread([this] { watch_loop(); });
  }

  // One attempt of `start_watch`: kUnavailable when the server is busy.
  void claim_watch(const std::string& host, int rank, Deadline deadline) {
    watch_sock = net::connect_tcp(host, port, deadline);
    const Deadline io = std::max(deadline, deadline_after(milliseconds{1000}));
    const auto exchange = [&](const wire::RequestHeader& h, std::span<const std::byte> value) {
      auto hb = wire::encode(h);
      IoResult r = net::send_all(watch_sock.get(), hb, io);
      if (r.status == Io::kOk && !value.empty()) r = net::send_all(watch_sock.get(), value, io);
      wire::ReplyBytes rb;
      if (r.status == Io::kOk) r = net::recv_all(watch_sock.get(), rb, io);
      TPCOMM_CHECK(
          r.status == Io::kOk, r.status == Io::kTimeout ? Status::kTimeout : Status::kSystemError,
          "store watch: the connection to the store at ", address, " failed: ", net::describe(r));
      const wire::ReplyHeader reply = wire::decode_reply(rb);
      const auto malformed = wire::check_reply(reply, 0);
      TPCOMM_CHECK(!malformed || reply.code != ReplyCode::kOk, Status::kProtocolError,
                   "store watch: malformed reply from ", address, ": ", malformed.value_or(""));
      if (reply.code == ReplyCode::kOk) return;
      // An error reply's reason (at most `kMaxReasonBytes`, which `check_reply` bounds).
      std::string reason;
      if (!wire::check_reply(reply, wire::kMaxReasonBytes)) {
        reason.resize(reply.value_len);
        if (net::recv_all(watch_sock.get(),
                          std::as_writable_bytes(std::span(reason.data(), reason.size())), io)
                .status != Io::kOk)
          reason.clear();
      }
      const std::string why = reason.empty() ? std::string(wire::to_string(reply.code)) : reason;
      TPCOMM_CHECK(reply.code != ReplyCode::kBusy, Status::kUnavailable,
                   "store watch: the store at ", address, " is busy: ", why);
      TPCOMM_THROW(reply.code == ReplyCode::kRefused || reply.code == ReplyCode::kUnauthenticated
                       ? Status::kInvalidArgument
                       : Status::kProtocolError,
                   "store watch of rank ", rank, ": the store at ", address,
                   " refused the watch connection: ", why);
    };
    exchange({.opcode = Opcode::kHello, .value_len = config.token.size()},
             wire::as_bytes(config.token));
    exchange({.opcode = Opcode::kWatch, .value_len = watch_secret.size(), .arg = rank},
             watch_secret);
  }

  void watch_loop() noexcept {
    std::string lost;
    int lost_rank = -1;
    for (;;) {
      wire::ReplyBytes rb;
      IoResult r = net::recv_all(watch_sock.get(), rb, kNoDeadline);
      if (r.status != Io::kOk) break;
      const wire::ReplyHeader h = wire::decode_reply(rb);
      if (wire::check_reply(h, 0)) break;
      std::string reason(h.value_len, '\0');
      r = net::recv_all(watch_sock.get(),
                        std::as_writable_bytes(std::span(reason.data(), reason.size())),
                        deadline_after(milliseconds{1000}));
      if (r.status != Io::kOk) break;
      if (h.code == ReplyCode::kOk && h.result == -1) return;  // the server stops: a normal end
      if (h.code == ReplyCode::kRankLost) {
        lost = reason;
        lost_rank = static_cast<int>(h.result);
        break;
      }
    }
    if (leaving.load()) return;
    if (lost.empty()) {
      lost = concat("the store at ", address,
                    " closed the connection without stopping: its host (rank 0, or the process "
                    "serving the store) is gone");
    }
    try {
      rank_watch->notify(lost_rank, lost);
    } catch (...) {  // NOLINT(bugprone-empty-catch): nothing left to tell
    }
  }

  // Leaves normally: the server will not report this rank as lost.
  void stop_watch() noexcept {
    if (!watcher.joinable()) return;
    leaving.store(true);
    const auto hb = wire::encode(wire::RequestHeader{.opcode = Opcode::kWatch, .arg = -1});
    net::send_all(watch_sock.get(), hb, deadline_after(milliseconds{500}));
    ::shutdown(watch_sock.get(), SHUT_RDWR);
    watcher.join();
    watch_sock.reset();
  }
};

TcpStore::TcpStore(Config config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.config = std::move(config);
  default_timeout_ = m.config.timeout;
  m.limits = {m.config.server.max_key_bytes, m.config.server.max_value_bytes};
  TPCOMM_CHECK(m.config.token.size() <= wire::kMaxTokenBytes, Status::kInvalidArgument,
               "the store token is longer than ", wire::kMaxTokenBytes, " bytes");
  std::string connect_host = m.config.host;
  if (m.config.host_server) {
    TcpStoreServerConfig sc = m.config.server;
    sc.port = m.config.port;
    if (sc.token.empty()) sc.token = m.config.token;
    m.server = std::make_unique<TcpStoreServer>(std::move(sc));
    m.port = m.server->port();
    // The hosting rank reaches its own server through the address it is bound to.
    const std::string& bind = m.config.server.bind;
    connect_host =
        net::is_wildcard(bind) ? (bind.find(':') != std::string::npos ? "::1" : "127.0.0.1") : bind;
  } else {
    TPCOMM_CHECK(m.config.port > 0 && m.config.port <= 65535, Status::kInvalidArgument,
                 "store port ", m.config.port, " is out of range 1..65535");
    m.port = m.config.port;
  }
  m.address = net::join_host_port(connect_host, m.port);
  const Deadline deadline = deadline_after(m.config.timeout);
  // A server at its connection limit answers "busy" and closes, or closes a connection whose
  // HELLO it has not read yet to make room for a new one: like a refused connection, both are
  // retried, with a growing pause, until the deadline; then the last refusal is reported.
  for (milliseconds pause{10};; pause = std::min(2 * pause, milliseconds{500})) {
    m.sock = net::connect_tcp(connect_host, m.port, deadline);
    // The handshake gets at least a second even when connecting took the whole timeout.
    const Deadline hello = std::max(deadline, deadline_after(milliseconds{1000}));
    try {
      const std::int64_t version =
          m.call("store hello", Opcode::kHello, {}, wire::as_bytes(m.config.token), 0, hello,
                 m.config.timeout)
              .header.result;
      if (version != wire::kVersion) {
        m.broken = "protocol version mismatch";
        TPCOMM_THROW(Status::kProtocolError, "store hello: the store at ", m.address,
                     " speaks protocol version ", version, ", this client ", wire::kVersion,
                     " (the client and the store come from different tpcomm releases)");
      }
      break;
    } catch (const Error& e) {
      if (!Impl::retry_handshake(e) || SteadyClock::now() >= deadline) throw;
      m.broken.clear();
      std::this_thread::sleep_for(
          std::min<SteadyClock::duration>(pause, deadline - SteadyClock::now()));
      if (SteadyClock::now() >= deadline) throw;
    }
  }
  if (m.config.watch_rank >= 0) m.start_watch(connect_host, m.config.watch_rank, deadline);
  TPCOMM_LOG_DEBUG("store: connected to ", m.address);
}

TcpStore::~TcpStore() {
  Impl& m = *impl_;
  m.stop_watch();
  m.sock.reset();
  if (m.server) {
    // Peers that have just finished their last operation may still be reading its reply:
    // give them `linger` to disconnect before the server goes away.
    if (!m.server->wait_idle(m.config.linger)) {
      TPCOMM_LOG_INFO("store: stopping the server at ", m.address, " with ",
                      m.server->connections(), " clients still connected");
    }
    m.server->stop();
  }
}

int TcpStore::port() const noexcept { return impl_->port; }

std::shared_ptr<RankWatch> TcpStore::rank_watch() const noexcept { return impl_->rank_watch; }

void TcpStore::set(std::string_view key, std::span<const std::byte> value, Milliseconds timeout) {
  const std::string what = concat("store set ", wire::quote_key(key));
  impl_->check_key(what, key);
  TPCOMM_CHECK(value.size() <= impl_->limits.max_value_bytes, Status::kInvalidArgument, what,
               ": value of ", value.size(), " bytes is longer than the limit of ",
               impl_->limits.max_value_bytes);
  impl_->call(what, Opcode::kSet, key, value, 0, deadline_after(timeout), timeout);
}

Bytes TcpStore::get(std::string_view key, Milliseconds timeout) {
  const std::string what = concat("store get ", wire::quote_key(key));
  impl_->check_key(what, key);
  return impl_->wait_for(what, Opcode::kGet, key, deadline_after(timeout), timeout).value;
}

std::int64_t TcpStore::add(std::string_view key, std::int64_t delta, Milliseconds timeout) {
  const std::string what = concat("store add ", wire::quote_key(key));
  impl_->check_key(what, key);
  return impl_->call(what, Opcode::kAdd, key, {}, delta, deadline_after(timeout), timeout)
      .header.result;
}

void TcpStore::wait(std::span<const std::string> keys, Milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  for (const std::string& key : keys) {
    const std::string what = concat("store wait ", wire::quote_key(key));
    impl_->check_key(what, key);
    impl_->wait_for(what, Opcode::kWait, key, deadline, timeout);
  }
}

bool TcpStore::check(std::span<const std::string> keys, Milliseconds timeout) {
  const Deadline deadline = deadline_after(timeout);
  for (const std::string& key : keys) {
    const std::string what = concat("store check ", wire::quote_key(key));
    impl_->check_key(what, key);
    if (impl_->call(what, Opcode::kCheck, key, {}, 0, deadline, timeout).header.result == 0)
      return false;
  }
  return true;
}

bool TcpStore::erase(std::string_view key, Milliseconds timeout) {
  const std::string what = concat("store erase ", wire::quote_key(key));
  impl_->check_key(what, key);
  return impl_->call(what, Opcode::kErase, key, {}, 0, deadline_after(timeout), timeout)
             .header.result != 0;
}

}  // namespace tpcomm
