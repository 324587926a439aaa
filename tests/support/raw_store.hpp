// SPDX-License-Identifier: Apache-2.0
// Store frames sent by hand, as a client that is no `TcpStore` (a hostile one, or a forked child
// that must not start threads) sends them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm::testing {

/// A reply as it came: its header and its payload (a value, or an error's reason).
struct RawReply {
  wire::ReplyHeader header;
  Bytes payload;
  [[nodiscard]] std::string text() const {
    return {reinterpret_cast<const char*>(payload.data()), payload.size()};
  }
};

/// Sends one request and reads its reply; throws when the connection fails first.
inline RawReply raw_request(int fd, const wire::RequestHeader& h,
                            std::span<const std::byte> value = {}) {
  using namespace std::chrono_literals;
  const Deadline d = deadline_after(5s);
  const auto hb = wire::encode(h);
  wire::ReplyBytes rb;
  if (net::send_all(fd, hb, d).status != net::Io::kOk ||
      (!value.empty() && net::send_all(fd, value, d).status != net::Io::kOk) ||
      net::recv_all(fd, rb, d).status != net::Io::kOk)
    throw std::runtime_error("the store closed the connection");
  RawReply r{wire::decode_reply(rb), {}};
  if (wire::check_reply(r.header, std::size_t{1} << 20)) throw std::runtime_error("bad reply");
  r.payload.resize(r.header.value_len);
  if (net::recv_all(fd, r.payload, d).status != net::Io::kOk)
    throw std::runtime_error("the store closed the connection");
  return r;
}

/// A connection that said HELLO (with `token`) and was accepted.
inline net::Socket raw_hello(int port, const std::string& token = {}) {
  using namespace std::chrono_literals;
  net::Socket s = net::connect_tcp("127.0.0.1", port, deadline_after(10s));
  const RawReply r = raw_request(
      s.get(), {.opcode = wire::Opcode::kHello, .value_len = token.size()}, wire::as_bytes(token));
  if (r.header.code != wire::ReplyCode::kOk)
    throw std::runtime_error("the store refused HELLO: " + r.text());
  return s;
}

/// CLAIM of `rank` on `fd`.
inline RawReply raw_claim(int fd, std::int64_t rank) {
  return raw_request(fd, {.opcode = wire::Opcode::kClaim, .arg = rank});
}

/// WATCH of `rank` on `fd` with `secret`.
inline RawReply raw_watch_with(int fd, std::int64_t rank, std::span<const std::byte> secret) {
  return raw_request(fd, {.opcode = wire::Opcode::kWatch, .value_len = secret.size(), .arg = rank},
                     secret);
}

/// A rank's watch connection made by hand, as `TcpStore` makes it (a claim over a first
/// connection, then the watch with its secret) but without its thread: forked children must
/// not start threads (ThreadSanitizer does not support it). Throws with the store's reason when
/// it refuses.
inline net::Socket raw_watch(int port, int rank) {
  net::Socket requests = raw_hello(port);
  const RawReply claimed = raw_claim(requests.get(), rank);
  if (claimed.header.code != wire::ReplyCode::kOk)
    throw std::runtime_error("the store refused the claim: " + claimed.text());
  net::Socket w = raw_hello(port);
  const RawReply watched = raw_watch_with(w.get(), rank, claimed.payload);
  if (watched.header.code != wire::ReplyCode::kOk)
    throw std::runtime_error("the store refused the watch connection: " + watched.text());
  return w;
}

/// Leaves as a rank does when its store client is destroyed.
inline void raw_leave(net::Socket& s) {
  using namespace std::chrono_literals;
  const auto hb = wire::encode(wire::RequestHeader{.opcode = wire::Opcode::kWatch, .arg = -1});
  if (net::send_all(s.get(), hb, deadline_after(5s)).status != net::Io::kOk)
    throw std::runtime_error("cannot leave");
  s.reset();
}

}  // namespace tpcomm::testing
