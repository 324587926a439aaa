// SPDX-License-Identifier: Apache-2.0
// The store's answer to a large SET while the bytes in flight are at `max_inflight_bytes`: "busy"
// from the request's header, before its value is sent (NOTE [store wire format] 5).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "core/log.hpp"
#include "support/child.hpp"
#include "support/raw_store.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using namespace std::chrono_literals;
using testing::eventually;
using testing::raw_hello;
using testing::RawReply;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kClients = 4;

// Client `i`'s key: two bytes.
std::string key_of(int i) { return {'k', static_cast<char>('0' + i)}; }

// One request's worth of room in flight: one 1 MiB SET at a time.
TcpStoreServerConfig one_at_a_time() {
  TcpStoreServerConfig sc;
  sc.max_key_bytes = 64;
  sc.max_value_bytes = kMiB;
  sc.max_inflight_bytes = kMiB + 64;
  return sc;
}

TcpStore::Config client_config(const TcpStoreServerConfig& sc, int port) {
  TcpStore::Config c;
  c.port = port;
  c.timeout = 10s;
  c.server = sc;
  return c;
}

void send(int fd, std::span<const std::byte> bytes) {
  ASSERT_EQ(net::send_all(fd, bytes, deadline_after(5s)).status, net::Io::kOk);
}

// The next reply on `fd` within `timeout`; nullopt when none comes (or the connection ends).
std::optional<RawReply> read_reply(int fd, std::chrono::milliseconds timeout) {
  const Deadline d = deadline_after(timeout);
  wire::ReplyBytes rb;
  if (net::recv_all(fd, rb, d).status != net::Io::kOk) return std::nullopt;
  RawReply r{wire::decode_reply(rb), {}};
  if (wire::check_reply(r.header, 0)) return std::nullopt;
  r.payload.resize(r.header.value_len);
  if (net::recv_all(fd, r.payload, d).status != net::Io::kOk) return std::nullopt;
  return r;
}

// A raw client's SET of `kMiB` bytes under a one-byte key: its header and key, then nothing
// more, so the request holds the whole store's room in flight until `finish`.
class Holder {
 public:
  explicit Holder(const TcpStoreServer& server) : sock_(raw_hello(server.port())) {
    send(sock_.get(), wire::encode(wire::RequestHeader{
                          .opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB}));
    send(sock_.get(), wire::as_bytes("h"));
    EXPECT_TRUE(eventually([&] { return server.inflight_bytes() == kMiB + 1; }, 5s))
        << server.inflight_bytes();
  }
  // Sends the value (its go-ahead, when the server sends one, waits unread meanwhile) and
  // expects the SET stored.
  void finish() {
    send(sock_.get(), Bytes(kMiB, std::byte{1}));
    std::optional<RawReply> reply = read_reply(sock_.get(), 5s);
    if (reply && reply->header.code == wire::ReplyCode::kGoAhead)
      reply = read_reply(sock_.get(), 5s);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->header.code, wire::ReplyCode::kOk) << reply->text();
  }

 private:
  net::Socket sock_;
};

// `kClients` clients SET 1 MiB each at once while `holder` keeps the room in flight until each
// has been refused `refusals` times in all; then everyone finishes.
void set_all_at_once(TcpStoreServer& server, const TcpStoreServerConfig& sc, Holder& holder,
                     std::int64_t refusals) {
  std::vector<std::thread> threads;
  std::atomic<int> stored{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore c(client_config(sc, server.port()));
        c.set(key_of(i), Bytes(kMiB, static_cast<std::byte>(i)));
        stored.fetch_add(1);
      } catch (const Error& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
      }
    });
  }
  EXPECT_TRUE(eventually([&] { return server.rejected_frames() >= refusals; }, 5s))
      << server.rejected_frames() << " refusals";
  holder.finish();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(stored.load(), kClients);
  EXPECT_TRUE(eventually([&] { return server.inflight_bytes() == 0; }, 5s));
}

// Clients over the room in flight wait their turn by sending headers: every value crosses the
// network once, however often its SET was refused.
TEST(StoreBusy, ConcurrentLargeSetsSendEachValueOnce) {
  const TcpStoreServerConfig sc = one_at_a_time();
  TcpStoreServer server(sc);
  Holder holder(server);
  set_all_at_once(server, sc, holder, kClients);
  const std::int64_t refused = server.rejected_frames();
  EXPECT_GE(refused, kClients);
  // The holder's key and value, each client's key and value, and a two-byte key for each
  // refused attempt: no value twice.
  const std::uint64_t expected =
      1 + kMiB + kClients * (2 + kMiB) + 2 * static_cast<std::uint64_t>(refused);
  EXPECT_EQ(server.received_payload_bytes(), expected)
      << "values received " << static_cast<double>(server.received_payload_bytes()) / kMiB
      << " MiB for " << kClients + 1 << " values of 1 MiB";
  TcpStore reader(client_config(sc, server.port()));
  for (int i = 0; i < kClients; ++i)
    EXPECT_TRUE(reader.get(key_of(i)) == Bytes(kMiB, static_cast<std::byte>(i)));
}

// The refusal comes from the header: a client that sends a large SET's header and key and then
// waits gets "over limit, try again" without sending a byte of its value, and its connection
// stays open; once there is room, the same header gets the go-ahead.
TEST(StoreBusy, ALargeSetIsRefusedBeforeItsValue) {
  const TcpStoreServerConfig sc = one_at_a_time();
  TcpStoreServer server(sc);
  Holder holder(server);
  net::Socket b = raw_hello(server.port());
  const auto header = wire::encode(
      wire::RequestHeader{.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB});
  send(b.get(), header);
  send(b.get(), wire::as_bytes("b"));
  std::optional<RawReply> busy = read_reply(b.get(), 2s);
  ASSERT_TRUE(busy.has_value()) << "no answer before the value";
  EXPECT_EQ(busy->header.code, wire::ReplyCode::kOverLimit);
  EXPECT_EQ(busy->header.result, wire::kRetryLater);
  EXPECT_NE(busy->text().find("max_inflight_bytes"), std::string::npos) << busy->text();
  EXPECT_EQ(server.received_payload_bytes(), 2u);  // the two keys
  EXPECT_EQ(server.rejected_frames(), 1);
  // The connection serves the next request.
  send(b.get(), wire::encode(wire::RequestHeader{.opcode = wire::Opcode::kCheck, .key_len = 1}));
  send(b.get(), wire::as_bytes("b"));
  std::optional<RawReply> check = read_reply(b.get(), 2s);
  ASSERT_TRUE(check.has_value());
  EXPECT_EQ(check->header.code, wire::ReplyCode::kOk);
  EXPECT_EQ(check->header.result, 0);
  holder.finish();
  ASSERT_TRUE(eventually([&] { return server.inflight_bytes() == 0; }, 5s));
  send(b.get(), header);
  send(b.get(), wire::as_bytes("b"));
  std::optional<RawReply> go = read_reply(b.get(), 2s);
  ASSERT_TRUE(go.has_value());
  EXPECT_EQ(go->header.code, wire::ReplyCode::kGoAhead);
  send(b.get(), Bytes(kMiB, std::byte{2}));
  std::optional<RawReply> stored = read_reply(b.get(), 5s);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->header.code, wire::ReplyCode::kOk) << stored->text();
  EXPECT_EQ(server.received_payload_bytes(), 4 + 2 * kMiB);  // and the CHECK's key
}

// A value up to `kMaxEagerValueBytes` still follows its header at once: no go-ahead.
TEST(StoreBusy, ASmallSetSendsItsValueWithItsHeader) {
  TcpStoreServer server(TcpStoreServerConfig{});
  net::Socket s = raw_hello(server.port());
  Bytes key_and_value(1 + wire::kMaxEagerValueBytes, std::byte{3});
  key_and_value[0] = std::byte{'s'};
  const RawReply r = testing::raw_request(
      s.get(), {.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = wire::kMaxEagerValueBytes},
      key_and_value);
  EXPECT_EQ(r.header.code, wire::ReplyCode::kOk) << r.text();
}

// A client refused again and again for want of room in flight is one warning in the log, not
// one per attempt.
TEST(StoreBusy, ARefusedClientIsOneWarning) {
  const TcpStoreServerConfig sc = one_at_a_time();
  TcpStoreServer server(sc);
  Holder holder(server);
  const LogLevel level = log::level();
  log::set_level(LogLevel::kWarn);
  ::testing::internal::CaptureStderr();
  // Each client is refused several times on average before the holder lets go.
  set_all_at_once(server, sc, holder, 4 * kClients);
  const std::string log = ::testing::internal::GetCapturedStderr();
  log::set_level(level);
  EXPECT_GE(server.rejected_frames(), 4 * kClients);
  int warnings = 0;
  for (std::size_t at = log.find("max_inflight_bytes"); at != std::string::npos;
       at = log.find("max_inflight_bytes", at + 1))
    ++warnings;
  EXPECT_GE(warnings, 1) << log;
  EXPECT_LE(warnings, kClients) << log;
}

}  // namespace
}  // namespace tpcomm
