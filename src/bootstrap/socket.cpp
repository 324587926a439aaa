// SPDX-License-Identifier: Apache-2.0
// TCP helpers of the store. Every blocking step is a poll() bounded by a deadline.
#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <thread>

#include "core/check.hpp"

namespace tpcomm::net {
namespace {

using std::chrono::milliseconds;

int poll_timeout(Deadline deadline) noexcept {
  if (deadline == kNoDeadline) return -1;
  auto ms = remaining(deadline).count();
  return static_cast<int>(std::min<std::int64_t>(ms, INT_MAX));
}

// Waits for `events` on `fd`; kOk when any requested event (or an error condition) is
// reported. Retries EINTR with the time that is left.
IoResult wait_for(int fd, short events, Deadline deadline) noexcept {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_timeout(deadline));
    if (rc > 0) return {};
    if (rc == 0) return {Io::kTimeout, 0, 0};
    if (errno != EINTR) return {Io::kError, errno, 0};
  }
}

bool is_reset(int err) noexcept { return err == ECONNRESET || err == EPIPE || err == ENOTCONN; }

std::string strip_brackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

bool is_loopback_address(const sockaddr* sa) noexcept {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

void Socket::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string describe(const IoResult& r) {
  switch (r.status) {
    case Io::kOk:
      return "ok";
    case Io::kTimeout:
      return "timed out";
    case Io::kClosed:
      return r.error != 0 ? detail::concat("connection closed by peer (", errno_text(r.error), ")")
                          : "connection closed by peer";
    case Io::kError:
      return errno_text(r.error);
  }
  return "unknown";
}

IoResult send_all(int fd, std::span<const std::byte> data, Deadline deadline) noexcept {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult w = wait_for(fd, POLLOUT, deadline);
      if (w.status != Io::kOk) return {w.status, w.error, done};
      continue;
    }
    int err = n < 0 ? errno : 0;
    return {is_reset(err) ? Io::kClosed : Io::kError, err, done};
  }
  return {Io::kOk, 0, done};
}

IoResult recv_all(int fd, std::span<std::byte> data, Deadline deadline) noexcept {
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {Io::kClosed, 0, done};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult w = wait_for(fd, POLLIN, deadline);
      if (w.status != Io::kOk) return {w.status, w.error, done};
      continue;
    }
    int err = errno;
    return {is_reset(err) ? Io::kClosed : Io::kError, err, done};
  }
  return {Io::kOk, 0, done};
}

IoResult wait_readable(int fd, Deadline deadline) noexcept {
  return wait_for(fd, POLLIN, deadline);
}

bool peer_hung_up(int fd) noexcept {
  pollfd p{fd, POLLRDHUP, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, 0);
  } while (rc < 0 && errno == EINTR);
  return rc > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

std::string Address::text() const {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return join_host_port(buf, ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return join_host_port(buf, ntohs(in6->sin6_port));
  }
  return "?";
}

std::vector<Address> resolve(const std::string& host, int port, bool passive) {
  TPCOMM_CHECK(port >= 0 && port <= 65535, Status::kInvalidArgument, "port ", port,
               " is out of range 0..65535");
  const std::string name = strip_brackets(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(name.empty() ? nullptr : name.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    TPCOMM_THROW(Status::kInvalidArgument, "cannot resolve host \"", host,
                 "\": ", rc == EAI_SYSTEM ? errno_text(errno) : ::gai_strerror(rc));
  }
  std::vector<Address> out;
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    Address a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.length = static_cast<socklen_t>(ai->ai_addrlen);
    out.push_back(a);
  }
  ::freeaddrinfo(list);
  TPCOMM_CHECK(!out.empty(), Status::kInvalidArgument, "host \"", host,
               "\" has no IPv4 or IPv6 address");
  return out;
}

Socket listen_tcp(const std::string& address, int port, int backlog) {
  const bool wildcard = is_wildcard(address);
  std::vector<Address> addrs = resolve(address, port, /*passive=*/true);
  if (wildcard && strip_brackets(address) == "::") {
    // One dual-stack socket serves both families; try IPv6 first.
    std::stable_partition(addrs.begin(), addrs.end(),
                          [](const Address& a) { return a.storage.ss_family == AF_INET6; });
  }
  std::string errors;
  for (const Address& a : addrs) {
    Socket s(::socket(a.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) {
      errors += detail::concat(errors.empty() ? "" : "; ", a.text(), ": ", errno_text(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a.storage.ss_family == AF_INET6 && wildcard) {
      int zero = 0;
      ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (::bind(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0 ||
        ::listen(s.get(), backlog) != 0) {
      errors += detail::concat(errors.empty() ? "" : "; ", a.text(), ": ", errno_text(errno));
      continue;
    }
    return s;
  }
  TPCOMM_THROW(Status::kSystemError, "cannot listen on ", join_host_port(address, port), ": ",
               errors);
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  TPCOMM_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0, Status::kSystemError,
               "getsockname: ", errno_text(errno));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  TPCOMM_THROW(Status::kSystemError, "getsockname: not an IP socket");
}

Socket connect_tcp(const std::string& host, int port, Deadline deadline) {
  TPCOMM_CHECK(port > 0 && port <= 65535, Status::kInvalidArgument, "port ", port,
               " is out of range 1..65535");
  std::string last_error = "no attempt";
  milliseconds pause{10};
  for (;;) {
    std::vector<Address> addrs;
    try {
      addrs = resolve(host, port, /*passive=*/false);
    } catch (const Error& e) {
      // A name that does not resolve yet (a pod that is still starting) is retried like a
      // refused connection.
      last_error = e.what();
    }
    for (const Address& a : addrs) {
      Socket s(::socket(a.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!s) {
        last_error = errno_text(errno);
        continue;
      }
      int err = 0;
      if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
        err = errno;
        if (err == EINPROGRESS || err == EINTR) {
          IoResult w = wait_for(s.get(), POLLOUT, deadline);
          if (w.status == Io::kTimeout) {
            last_error = "timed out";
            continue;
          }
          socklen_t len = sizeof(err);
          if (w.status != Io::kOk || ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = w.error != 0 ? w.error : errno;
          }
        }
      }
      if (err != 0) {
        last_error = detail::concat(a.text(), ": ", errno_text(err));
        continue;
      }
      int flags = ::fcntl(s.get(), F_GETFL);
      ::fcntl(s.get(), F_SETFL, flags & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return s;
    }
    auto left = remaining(deadline);
    if (left.count() == 0) {
      TPCOMM_THROW(Status::kTimeout, "no store server accepted a connection at ",
                   join_host_port(host, port), " before the deadline (last error: ", last_error,
                   ")");
    }
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, milliseconds{500});
  }
}

bool is_wildcard(const std::string& host) noexcept {
  const std::string h = strip_brackets(host);
  return h.empty() || h == "0.0.0.0" || h == "::";
}

bool is_loopback(const std::string& host) noexcept {
  try {
    const std::string h = strip_brackets(host);
    if (h.empty()) return false;
    if (h == "localhost" || (h.size() > 10 && h.ends_with(".localhost"))) return true;
    in_addr v4{};
    if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    in6_addr v6{};
    if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
      sockaddr_in6 sa{};
      sa.sin6_family = AF_INET6;
      sa.sin6_addr = v6;
      return is_loopback_address(reinterpret_cast<const sockaddr*>(&sa));
    }
    std::vector<Address> addrs = resolve(h, 0, /*passive=*/false);
    return std::all_of(addrs.begin(), addrs.end(), [](const Address& a) {
      return is_loopback_address(reinterpret_cast<const sockaddr*>(&a.storage));
    });
  } catch (...) {
    return false;
  }
}

int free_port() {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TPCOMM_CHECK(s.valid(), Status::kSystemError, "socket: ", errno_text(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  TPCOMM_CHECK(::bind(s.get(), reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) == 0,
               Status::kSystemError, "bind 127.0.0.1:0: ", errno_text(errno));
  return local_port(s.get());
}

std::string peer_name(int fd) {
  Address a;
  a.length = sizeof(a.storage);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a.storage), &a.length) != 0) return "?";
  return a.text();
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[')
    return detail::concat("[", host, "]:", port);
  return detail::concat(host, ":", port);
}

}  // namespace tpcomm::net
