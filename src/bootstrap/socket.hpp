// SPDX-License-Identifier: Apache-2.0
// TCP sockets for the store: an owning fd, bounded send/receive, listen, connect with retry.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/deadline.hpp"

namespace tpcomm::net {

/// An owned file descriptor; closed on destruction. Move-only.
class Socket {
 public:
  Socket() noexcept = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  /// Gives up ownership; returns the fd (or -1).
  int release() noexcept {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  /// Closes the owned fd, if any, and takes `fd`.
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// How a bounded transfer ended.
enum class Io {
  kOk,
  /// The deadline passed first.
  kTimeout,
  /// The peer closed the connection (end of stream, reset, or broken pipe).
  kClosed,
  /// Another system error; `IoResult::error` holds errno.
  kError,
};

struct IoResult {
  Io status = Io::kOk;
  /// errno for `kError` (and for a reset connection reported as `kClosed`).
  int error = 0;
  /// Bytes transferred before the transfer ended.
  std::size_t bytes = 0;
};

/// "timed out", "connection closed by peer", or the system error text.
std::string describe(const IoResult& r);

/// Sends every byte of `data` before `deadline`. Never raises SIGPIPE; retries on EINTR.
IoResult send_all(int fd, std::span<const std::byte> data, Deadline deadline) noexcept;
/// Receives exactly `data.size()` bytes before `deadline`.
IoResult recv_all(int fd, std::span<std::byte> data, Deadline deadline) noexcept;
/// Waits until `fd` is readable (data, end of stream or an error) or the deadline passes.
/// Returns kOk or kTimeout (or kError when poll fails).
IoResult wait_readable(int fd, Deadline deadline) noexcept;
/// True when the peer has closed or reset the connection (POLLRDHUP/POLLHUP/POLLERR); does
/// not wait and does not consume data.
bool peer_hung_up(int fd) noexcept;

/// A resolved socket address.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  /// "1.2.3.4:80" or "[::1]:80".
  [[nodiscard]] std::string text() const;
};

/// The addresses of `host` (a name, an IPv4 or an IPv6 literal; brackets allowed) for TCP port
/// `port`, IPv4 and IPv6 alike, in getaddrinfo's order. `passive` resolves for binding.
/// Throws `Error(kInvalidArgument)` when the host cannot be resolved.
std::vector<Address> resolve(const std::string& host, int port, bool passive);

/// A listening TCP socket bound to `address`:`port` (port 0 = an ephemeral port) with
/// SO_REUSEADDR and close-on-exec. "0.0.0.0" and "::" bind every interface ("::" accepts IPv4
/// too). Throws `Error(kSystemError)` naming the address when it cannot be bound.
Socket listen_tcp(const std::string& address, int port, int backlog = SOMAXCONN);

/// The local port of a bound socket.
int local_port(int fd);

/// Connects to `host`:`port`, trying every resolved address and retrying refused or unreachable
/// connections with a growing pause until `deadline`: the server may start after its clients.
/// The socket is close-on-exec with TCP_NODELAY. Throws `Error(kTimeout)` naming the address and
/// the last error when nothing accepted the connection in time.
Socket connect_tcp(const std::string& host, int port, Deadline deadline);

/// True when `host` names this machine's loopback interface: "localhost", 127.0.0.0/8, ::1, or
/// a name that resolves only to loopback addresses.
bool is_loopback(const std::string& host) noexcept;

/// True for "0.0.0.0", "::" and "" (bind every interface).
bool is_wildcard(const std::string& host) noexcept;

/// A TCP port that was free on 127.0.0.1 a moment ago. Another process may take it before it is
/// bound again; callers that can bind port 0 directly should.
int free_port();

/// The remote address of a connected socket, for log messages ("?" when unknown).
std::string peer_name(int fd);

/// "host:port", with IPv6 literals in brackets.
std::string join_host_port(const std::string& host, int port);

}  // namespace tpcomm::net
