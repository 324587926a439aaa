// SPDX-License-Identifier: Apache-2.0
// Key-value stores: the side channel that NCCL ids, IPC handles and tuning tables travel on.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tpcomm {

using Bytes = std::vector<std::byte>;
class RankWatch;
using Milliseconds = std::chrono::milliseconds;

/// A key-value store shared by all ranks of a job. Values are raw bytes with a length, never
/// serialised objects. Every operation is bounded by a timeout; on expiry it throws
/// `Error(kTimeout)` naming the key. A lost connection throws `Error(kSystemError)`.
///
/// Thread-safe: one instance may be used from several threads.
class Store {
 public:
  virtual ~Store() = default;

  /// Stores `value` under `key`, replacing any previous value, and wakes waiters.
  virtual void set(std::string_view key, std::span<const std::byte> value,
                   Milliseconds timeout) = 0;
  /// Returns the value of `key`, waiting up to `timeout` for it to be set.
  virtual Bytes get(std::string_view key, Milliseconds timeout) = 0;
  /// Adds `delta` to the 64-bit counter at `key` (created as 0) and returns the new value.
  /// A key holding a value that is not a counter, or a sum outside the range of `int64_t`,
  /// gives `Error(kInvalidArgument)` and leaves the key unchanged.
  virtual std::int64_t add(std::string_view key, std::int64_t delta, Milliseconds timeout) = 0;
  /// Waits up to `timeout` (in total) until every key exists.
  virtual void wait(std::span<const std::string> keys, Milliseconds timeout) = 0;
  /// True when every key exists; does not wait.
  virtual bool check(std::span<const std::string> keys, Milliseconds timeout) = 0;
  /// Removes `key`; true when it existed.
  virtual bool erase(std::string_view key, Milliseconds timeout) = 0;
  /// Who of the job's ranks is gone, where this store can tell (a `TcpStore` with a
  /// `watch_rank`); nullptr elsewhere. Groups built over the store subscribe to it.
  [[nodiscard]] virtual std::shared_ptr<RankWatch> rank_watch() const noexcept { return nullptr; }

  /// The timeout the convenience overloads use.
  [[nodiscard]] Milliseconds default_timeout() const noexcept { return default_timeout_; }
  void set_default_timeout(Milliseconds t) noexcept { default_timeout_ = t; }

  void set(std::string_view key, std::span<const std::byte> value) {
    set(key, value, default_timeout_);
  }
  void set(std::string_view key, std::string_view value) { set(key, value, default_timeout_); }
  void set(std::string_view key, std::string_view value, Milliseconds timeout) {
    set(key, std::as_bytes(std::span(value.data(), value.size())), timeout);
  }
  Bytes get(std::string_view key) { return get(key, default_timeout_); }
  std::int64_t add(std::string_view key, std::int64_t delta) {
    return add(key, delta, default_timeout_);
  }
  void wait(std::span<const std::string> keys) { wait(keys, default_timeout_); }
  bool check(std::span<const std::string> keys) { return check(keys, default_timeout_); }
  bool erase(std::string_view key) { return erase(key, default_timeout_); }

 protected:
  Milliseconds default_timeout_{30000};
};

/// A store for ranks that are threads of one process. Share one instance (`shared_ptr`).
class InProcessStore final : public Store {
 public:
  InProcessStore();
  ~InProcessStore() override;
  InProcessStore(const InProcessStore&) = delete;
  InProcessStore& operator=(const InProcessStore&) = delete;

  void set(std::string_view key, std::span<const std::byte> value, Milliseconds timeout) override;
  Bytes get(std::string_view key, Milliseconds timeout) override;
  std::int64_t add(std::string_view key, std::int64_t delta, Milliseconds timeout) override;
  void wait(std::span<const std::string> keys, Milliseconds timeout) override;
  bool check(std::span<const std::string> keys, Milliseconds timeout) override;
  bool erase(std::string_view key, Milliseconds timeout) override;
  using Store::add;
  using Store::check;
  using Store::erase;
  using Store::get;
  using Store::set;
  using Store::wait;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Limits and security settings of a TCP store server.
struct TcpStoreServerConfig {
  /// Address to bind; "127.0.0.1" keeps the store off the network.
  std::string bind = "127.0.0.1";
  /// 0 picks a free port (read it back with `port()`).
  int port = 0;
  /// When non-empty, every connection must present this token first or is closed.
  std::string token;
  /// Largest key, in bytes.
  std::size_t max_key_bytes = 4096;
  /// Largest value, in bytes; a frame announcing more is rejected before anything is read.
  std::size_t max_value_bytes = std::size_t{64} << 20;
  /// Most connections served at once. A new connection beyond this, or beyond
  /// `max_unauthenticated`, displaces (closes) the oldest connection still waiting to
  /// authenticate whose HELLO has not arrived, and is otherwise refused as busy (clients retry
  /// both until their timeout: a client with the token gets in however fast silent connections
  /// are opened and closed again). The default holds the launcher's largest world
  /// (1024 ranks, each with its request and watch connections) and 64 more. The server raises
  /// the process's soft limit of open files to fit it where the hard limit allows; where it does
  /// not, the server serves only as many as fit (256 descriptors kept aside) and says so once
  /// when it starts. At `max_connections`, with no unauthenticated connection to displace, a new
  /// one displaces the oldest authenticated connection that stands for no rank (no CLAIM) and
  /// sits between requests, where the store takes rank watches (`world_size` > 0 and
  /// `watch_ranks`: every rank's connections then stand for it).
  int max_connections = 2 * 1024 + 64;
  /// Most connections that have not yet authenticated (sent a valid HELLO) at once; see
  /// `max_connections` for what a new one beyond it gets. Connections that never say HELLO thus
  /// cannot keep a client with the token out. At least 1.
  int max_unauthenticated = 64;
  /// A connection must have authenticated within this time of connecting, or it is closed.
  Milliseconds hello_timeout{3000};
  /// A frame that starts arriving must be complete within this time, or the connection is
  /// dropped (a stalled client cannot pin a server thread).
  Milliseconds frame_timeout{10000};
  /// Most payload bytes the server holds in flight over all connections: keys and values of
  /// requests being read (counted as they arrive, never as announced) and values of GET
  /// replies being sent. A request that would go over it is read to its end, discarded and
  /// answered "over limit, try again"; a GET whose value would go over it is answered the same;
  /// the connection stays open and the client (`TcpStore`) sends the request again, after a
  /// growing pause of up to 50 ms, while another attempt fits before its operation's timeout,
  /// and then throws `Error(kUnavailable)` naming this limit. One
  /// request is in flight per connection, so a connection holds at most `max_key_bytes +
  /// max_value_bytes`. Must be at least that much.
  std::size_t max_inflight_bytes = std::size_t{256} << 20;
  /// Most keys stored at once; a SET or ADD that would create one more is answered "over
  /// limit" (`Error(kUnavailable)` naming this limit) and changes nothing.
  std::size_t max_keys = std::size_t{1} << 20;
  /// Most bytes stored at once, keys and values together; a SET or ADD that would go over it is
  /// answered "over limit" (`Error(kUnavailable)` naming this limit) and changes nothing. The
  /// store carries ids, handles and host names (a few hundred bytes per rank and collective),
  /// not tensors.
  std::size_t max_stored_bytes = std::size_t{1} << 30;
  /// The job's world size (the rank hosting the store knows it; `tpcomm store --world-size`).
  /// Rank watches are taken only of ranks 0..world_size-1; 0 (unknown) takes none. A rank claims
  /// its place over its own request connection and watches with the secret that claim returned;
  /// a claim of a rank held by another open connection, one that left or was lost, or a watch
  /// without the secret is refused naming why, and closing a refused connection loses nothing
  /// (NOTE [rank watch]).
  int world_size = 0;
  /// Whether the job watches its ranks (`TPCOMM_RANK_WATCH`): false refuses every claim and
  /// watch, naming why.
  bool watch_ranks = true;
};

/// The TCP store server: hosted by rank 0 inside a `TcpStore`, or standalone (`tpcomm store`).
///
/// Wire format: length-prefixed binary frames (see `src/bootstrap/wire.hpp`). Malformed,
/// oversized or unauthenticated frames close that one connection with an error reply; the
/// server keeps serving every other client. A connection must authenticate (HELLO with the
/// token, empty when none is configured) within `hello_timeout` of connecting. One thread
/// serves each connection; a GET or WAIT waiting for its key notices within about 100 ms that
/// its client hung up, and frees the thread. What clients can make the server hold is bounded
/// (`max_inflight_bytes`, `max_keys`, `max_stored_bytes`), and a client that stops reading a
/// reply for about a second is dropped (counted in `rejected_frames`).
class TcpStoreServer {
 public:
  /// Binds and starts serving on background threads. Throws `Error(kSystemError)` when the
  /// address cannot be bound.
  explicit TcpStoreServer(TcpStoreServerConfig config);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  /// The bound port.
  [[nodiscard]] int port() const noexcept;
  /// Number of frames rejected so far (malformed, oversized, unauthenticated, stalled, cut off
  /// by the client in the middle, or over a limit), and of replies the client did not read.
  [[nodiscard]] std::int64_t rejected_frames() const noexcept;
  /// Number of connections closed before they authenticated, to make room for new ones (see
  /// `TcpStoreServerConfig::max_connections`).
  [[nodiscard]] std::int64_t displaced_connections() const noexcept;
  /// Number of connections being served now (each holds one server thread).
  [[nodiscard]] int connections() const noexcept;
  /// Number of GET/WAIT requests waiting for their key now.
  [[nodiscard]] int waiting() const noexcept;
  /// Payload bytes held in flight now (see `TcpStoreServerConfig::max_inflight_bytes`).
  [[nodiscard]] std::size_t inflight_bytes() const noexcept;
  /// Payload bytes (keys, values, tokens) read from clients so far, whether stored or
  /// discarded: a value refused and sent again counts twice.
  [[nodiscard]] std::uint64_t received_payload_bytes() const noexcept;
  /// Bytes stored now, keys and values together.
  [[nodiscard]] std::size_t stored_bytes() const noexcept;
  /// Waits up to `timeout` until no client is connected; true when none is.
  bool wait_idle(Milliseconds timeout);
  /// Stops accepting, closes every connection and joins the threads. Idempotent.
  void stop() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Client of a TCP store server; optionally hosts the server itself (rank 0).
///
/// One connection, used by one operation at a time (callers from several threads take turns; a
/// GET or WAIT waits on the server a quarter second at a time, so a request from another thread
/// waits at most that long behind it).
/// Keys and values longer than `server.max_key_bytes` / `server.max_value_bytes` are refused
/// locally with `Error(kInvalidArgument)`. A GET or WAIT that the server times out throws
/// `Error(kTimeout)` naming the key; the connection stays usable. A request that would take
/// the server over one of its limits (`max_keys`, `max_stored_bytes`) throws
/// `Error(kUnavailable)` naming the limit, changes nothing, and leaves the connection usable;
/// one over `max_inflight_bytes` waits its turn (it is sent again until the operation's
/// timeout; a SET of a value over 64 KiB sends its value only once the server has room for it,
/// so a turn that does not come costs a header, not the value) and only then throws so. A lost
/// connection, a reply
/// that never comes, or an error reply after which the server closes the connection (wrong
/// token, malformed frame) makes this and every later operation throw: the client does not
/// reconnect, because an operation whose reply was lost may or may not have been applied.
class TcpStore final : public Store {
 public:
  struct Config {
    std::string host = "127.0.0.1";
    int port = 0;
    /// Host a server in this process, bound to `server.bind`:`port` (port 0 = any free one).
    bool host_server = false;
    TcpStoreServerConfig server{};
    /// Token presented to the server. A hosted server whose `server.token` is empty checks this
    /// one.
    std::string token;
    /// Default timeout of operations, and the time allowed to connect (the server may start
    /// later than its clients).
    Milliseconds timeout{30000};
    /// With `host_server`: how long the destructor waits for the other clients to disconnect
    /// before it stops the server, so that a peer still reading the reply of its last operation
    /// (the last barrier of a job) is not cut off.
    Milliseconds linger{3000};
    /// The job rank of this client, or -1. With a rank, the client claims the rank over its
    /// connection (a server refuses a rank past its world size, held by another connection, or
    /// gone: the constructor then throws `Error(kInvalidArgument)` with the server's reason) and
    /// keeps a second connection open on which the server learns that this rank's process is
    /// alive, and tells it when
    /// another rank's process is gone (its connection closed without leaving normally, which the
    /// destructor does): `rank_watch()` reports it, and from then on every GET or WAIT that
    /// waits for a key on any client fails at once with `Error(kAborted)` naming the rank.
    int watch_rank = -1;
  };

  /// Connects (retrying until `timeout`: the server may start later, or be at its connection
  /// limit) and presents the token. Throws `Error(kTimeout)` when no server accepts in time,
  /// `Error(kUnavailable)` when the server was still at its connection limit at the deadline,
  /// `Error(kInvalidArgument)` when the server refuses the token, `Error(kSystemError)` when a
  /// hosted server cannot bind.

  explicit TcpStore(Config config);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  /// The port of the server this client talks to.
  [[nodiscard]] int port() const noexcept;
  [[nodiscard]] std::shared_ptr<RankWatch> rank_watch() const noexcept override;

  void set(std::string_view key, std::span<const std::byte> value, Milliseconds timeout) override;
  Bytes get(std::string_view key, Milliseconds timeout) override;
  std::int64_t add(std::string_view key, std::int64_t delta, Milliseconds timeout) override;
  void wait(std::span<const std::string> keys, Milliseconds timeout) override;
  bool check(std::span<const std::string> keys, Milliseconds timeout) override;
  bool erase(std::string_view key, Milliseconds timeout) override;
  using Store::add;
  using Store::check;
  using Store::erase;
  using Store::get;
  using Store::set;
  using Store::wait;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
