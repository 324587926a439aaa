// SPDX-License-Identifier: Apache-2.0
// The TCP store's server: one thread per connection, started and joined by an accept thread.
#include "bootstrap/tcp_store_server_impl.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

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

// After rejecting a frame the server stops sending and reads what the client still sends, for
// at most this long and this many bytes, before it closes: closing with unread input would
// reset the connection and could destroy the error reply before the client reads it.
constexpr milliseconds kRejectLinger{500};
constexpr std::size_t kRejectDrainBytes = std::size_t{1} << 20;
// Connections refused for being over `max_connections` are closed this long after the busy
// reply, by the accept thread, and at most this many are held open for that.
constexpr milliseconds kBusyLinger{500};
constexpr std::size_t kMaxBusyLingering = 64;
// How long stop() gives the watch connections to send their stop notice.
constexpr milliseconds kWatchStopGrace{200};

// NOTE [store memory bounds]
// What clients can make the server hold is bounded:
// 1. A request's key and value are read in pieces of at most `kPiece` bytes as they arrive, so
//    a header that announces 64 MiB allocates nothing until the bytes come.
// 2. A request's key and value are counted against `max_inflight_bytes` (over all connections)
//    when its header arrives, whole, and given back when the request is stored; the copy of a
//    value that a GET replies with is counted before it is copied and given back when the reply
//    is sent. A request that finds no room holds nothing: it is answered kOverLimit (the
//    connection stays open) after its key, before its value when the value awaits the go-ahead
//    (NOTE [store wire format] 5), else after the value is read to its end and discarded; a GET
//    that finds none is not copied and answered the same. So a request being received keeps
//    its room to the end: requests arriving after it, retried however often, cannot take it
//    away. One request is in flight per connection, so a connection holds at most
//    `max_key_bytes + max_value_bytes`.
// 3. A reply is sent in pieces; a client that does not take one within `kReplyStall` is
//    dropped (and counted as rejected), so a slow or stopped reader frees what it holds soon.
// 4. Stored keys and bytes are bounded by `max_keys` and `max_stored_bytes`.
constexpr std::size_t kPiece = std::size_t{64} << 10;
constexpr milliseconds kReplyStall{1000};

// Descriptors beside the connections' sockets: the listener, the wake pipe, lingering busy
// connections, and what the rest of the process holds.
constexpr rlim_t kSpareFiles = 256;

// Each connection is a socket: a store for 1024 ranks (two connections each) needs more open
// files than the common soft limit of 1024. Raises the soft limit to fit `connections`, never
// past the hard limit, and returns how many connections fit: fewer where the hard limit is too
// low, said once here, so that connections beyond it are refused as busy (which clients retry)
// instead of failing `accept` with "too many open files" (which they cannot tell from a hang).
int fit_open_files(int connections) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return connections;
  const rlim_t want = static_cast<rlim_t>(connections) + kSpareFiles;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= want) return connections;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? want : std::min(want, limit.rlim_max);
  if (limit.rlim_cur > before && ::setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  if (limit.rlim_cur >= want) return connections;
  // Rank 0's own request and watch connections count, so at least those fit.
  const rlim_t room = limit.rlim_cur > kSpareFiles ? limit.rlim_cur - kSpareFiles : 0;
  const int fit = std::max(static_cast<int>(std::min(room, static_cast<rlim_t>(connections))),
                           std::min(connections, 2));
  TPCOMM_LOG_WARN("store: the open-file limit (", limit.rlim_cur, ", hard ", limit.rlim_max,
                  ") holds ", fit, " connections, not the ", connections,
                  " configured: serving at most ", fit, " (", fit / 2,
                  " ranks, two connections each; more are refused as busy). Raise the limit "
                  "(ulimit -n ",
                  want, ") for larger jobs");
  return fit;
}

void set_nodelay(int fd) noexcept {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

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
  // A connection over either limit displaces the oldest one still waiting to authenticate whose
  // HELLO has not arrived (`displace_oldest_unauthenticated`), else it is refused as busy; a
  // client retries both until its timeout. A client sends HELLO as soon as it connects, and its
  // connection's thread authenticates it as soon as it arrives: to be displaced, a connection
  // must stay silent while every connection accepted before it is displaced, so connections
  // that never say HELLO, however fast they are opened and closed again, cannot keep a client
  // with the token out, and a crowd of clients connecting at once is slowed, not cut off. Only
  // this thread adds to the counts; a displaced connection still counts until its thread ends,
  // so `active` may exceed `max_connections` by those for a moment.
  bool waiting_full;
  bool full;
  {
    std::lock_guard lock(count_mu);
    waiting_full = unauthenticated >= config.max_unauthenticated;
    full = active >= config.max_connections;
  }
  // At `max_connections` with no unauthenticated connection to displace, in a store whose ranks
  // claim their places (NOTE [rank watch]), an idle authenticated one that stands for no rank
  // goes (`displace_idle_rankless`): connections that said HELLO and then sit idle cannot keep a
  // rank out either. Ranks' connections are never displaced; nor is any connection of a store
  // whose clients claim no ranks (a job without rank watches: its ranks' own connections).
  const bool ranks_claim = config.watch_ranks && config.world_size > 0;
  const bool room = !(waiting_full || full) || displace_oldest_unauthenticated() ||
                    (!waiting_full && ranks_claim && displace_idle_rankless());
  if (!room) {
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
    // Bytes waiting to be read: its HELLO is here, and its thread is about to read it. One whose
    // peer has closed it (readable, with nothing to read) is gone: it is displaced like a silent
    // one, though its thread has not seen the end yet.
    int pending = 0;
    if (::ioctl(c->sock.get(), FIONREAD, &pending) == 0 && pending > 0) continue;
    if (!leave_waiting(*c, Auth::kDisplaced)) continue;
    ++displaced;
    TPCOMM_LOG_DEBUG("store: closed the connection from ", c->peer,
                     " before it authenticated, to make room for a new one (max_unauthenticated ",
                     config.max_unauthenticated, ", max_connections ", config.max_connections, ")");
    // The fd stays open until the thread is joined (see `conns`): this cannot hit a reused fd.
    ::shutdown(c->sock.get(), SHUT_RDWR);
    return true;
  }
  return false;
}

bool TcpStoreServer::Impl::displace_idle_rankless() {
  std::lock_guard lock(conn_mu);
  for (auto& c : conns) {
    if (c->auth.load() != Auth::kDone) continue;
    // Bytes waiting to be read: a request is arriving, and its thread is about to take it.
    int pending = 0;
    if (::ioctl(c->sock.get(), FIONREAD, &pending) == 0 && pending > 0) continue;
    Use idle = Use::kIdle;
    if (!c->use.compare_exchange_strong(idle, Use::kDisplaced)) continue;
    ++displaced;
    TPCOMM_LOG_DEBUG("store: closed the idle connection from ", c->peer,
                     ", which stands for no rank, to make room for a new one (max_connections ",
                     config.max_connections, ")");
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
    raw->id = next_connection_id++;
    conns.push_back(std::move(c));
  }
  try {
    raw->thread = std::thread([this, raw] {
      try {
        serve(*raw);
      } catch (const std::exception& e) {
        TPCOMM_LOG_ERROR("store: connection from ", raw->peer, " failed: ", e.what());
      }
      release_claim(*raw);
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

IoResult TcpStoreServer::Impl::read_payload(int fd, std::size_t n, Deadline deadline, Bytes* out) {
  std::array<std::byte, kPiece> piece;
  IoResult total;
  while (n > 0) {
    const std::size_t k = std::min(n, piece.size());
    IoResult r = net::recv_all(fd, std::span(piece.data(), k), deadline);
    total.bytes += r.bytes;
    received.fetch_add(r.bytes);
    if (r.status != Io::kOk) {
      r.bytes = total.bytes;
      return r;
    }
    if (out != nullptr)
      out->insert(out->end(), piece.begin(), piece.begin() + static_cast<long>(k));
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

void TcpStoreServer::Impl::note_retry_later(Connection& c, const std::string& reason) {
  rejected.fetch_add(1);
  if (c.warned_retry_later) {
    TPCOMM_LOG_DEBUG("store: refused a request from ", c.peer, " again: ", reason);
    return;
  }
  c.warned_retry_later = true;
  TPCOMM_LOG_WARN("store: refused a request from ", c.peer, ": ", reason,
                  " (its client retries; later refusals on this connection are logged at debug "
                  "level)");
}

void TcpStoreServer::Impl::serve(Connection& c) {
  const int fd = c.sock.get();
  const auto frame_ms = config.frame_timeout.count();
  bool authenticated = false;
  // NOTE [store wire format] 1: HELLO must come first, and within `hello_timeout` of the
  // connection, so silent connections cannot hold threads.
  const Deadline hello_deadline = deadline_after(config.hello_timeout);
  while (!stopping.load()) {
    // Between requests (see `displace_idle_rankless`); a connection that stands for a rank stays
    // kRank.
    Use busy = Use::kBusy;
    c.use.compare_exchange_strong(busy, Use::kIdle);
    IoResult w = net::wait_readable(fd, authenticated ? kNoDeadline : hello_deadline);
    if (stopping.load() || w.status == Io::kError) return;
    if (w.status == Io::kTimeout) {
      return reject(c, ReplyCode::kUnauthenticated,
                    concat("no HELLO within ", config.hello_timeout.count(), " ms of connecting"));
    }
    if (c.auth.load() == Auth::kDisplaced) return;
    if (Use idle = Use::kIdle;
        !c.use.compare_exchange_strong(idle, Use::kBusy) && idle == Use::kDisplaced)
      return;
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
    // NOTE [store memory bounds] 1, 2: the payload is counted whole, then read as it arrives.
    Held held(*this);
    const bool over_limit = !held.take(h.key_len + h.value_len);
    // NOTE [store wire format] 5: a large value comes only after the go-ahead, and not at all
    // when there is no room for it.
    const bool go_ahead = wire::awaits_go_ahead(h);
    Bytes key_bytes;
    Bytes value;
    r = read_payload(fd, h.key_len, frame_deadline, over_limit ? nullptr : &key_bytes);
    if (r.status == Io::kOk && go_ahead && !over_limit &&
        !send_reply(fd, wire::ReplyHeader{.code = ReplyCode::kGoAhead}, {}))
      return;
    if (r.status == Io::kOk && !(go_ahead && over_limit))
      r = read_payload(fd, h.value_len, frame_deadline, over_limit ? nullptr : &value);
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
      note_retry_later(c, reason);
      const wire::ReplyHeader over{
          .code = ReplyCode::kOverLimit, .value_len = reason.size(), .result = wire::kRetryLater};
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
  m.config.max_connections = fit_open_files(m.config.max_connections);
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

std::int64_t TcpStoreServer::displaced_connections() const noexcept {
  return impl_->displaced.load();
}

int TcpStoreServer::connections() const noexcept {
  std::lock_guard lock(impl_->count_mu);
  return impl_->active;
}

int TcpStoreServer::waiting() const noexcept { return impl_->waiting.load(); }

std::size_t TcpStoreServer::inflight_bytes() const noexcept { return impl_->inflight.load(); }

std::uint64_t TcpStoreServer::received_payload_bytes() const noexcept {
  return impl_->received.load();
}

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
