// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "core/log.hpp"
#include "support/child.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::eventually;
using testing::fork_child;
using testing::wait_child;

// How much later than its timeout a timed-out operation may return.
constexpr milliseconds kSlack{750};

std::string text(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

milliseconds since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t);
}

// Runs `f`, expects Error with `status` whose message contains `needle`.
template <class F>
void expect_error(F&& f, Status status, std::string_view needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << to_string(status);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "\"" << e.what() << "\" does not mention \"" << needle << "\"";
  }
}

TcpStore::Config client_config(int port, std::string token = "") {
  TcpStore::Config c;
  c.host = "127.0.0.1";
  c.port = port;
  c.token = std::move(token);
  c.timeout = 5s;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Semantics every store shares, run on InProcessStore and on TcpStore.

class StoreSemantics : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (is_tcp()) {
      server_.emplace(TcpStoreServerConfig{});
    } else {
      shared_ = std::make_shared<InProcessStore>();
      shared_->set_default_timeout(5s);
    }
  }
  [[nodiscard]] bool is_tcp() const { return std::string_view(GetParam()) == "tcp"; }

  // A client of the store under test; for TCP a new connection each time.
  std::shared_ptr<Store> client() {
    if (is_tcp()) return std::make_shared<TcpStore>(client_config(server_->port()));
    return shared_;
  }

  std::optional<TcpStoreServer> server_;
  std::shared_ptr<InProcessStore> shared_;
};

TEST_P(StoreSemantics, SetGetCheckErase) {
  auto s = client();
  const std::string k1 = "a/1";
  const std::string k2 = "a/2";
  EXPECT_FALSE(s->check(std::span(&k1, 1)));
  s->set(k1, "hello");
  EXPECT_EQ(text(s->get(k1)), "hello");
  EXPECT_TRUE(s->check(std::span(&k1, 1)));
  const std::string both[] = {k1, k2};
  EXPECT_FALSE(s->check(both));
  // Binary values keep their zero bytes; an empty value is a value.
  const std::byte binary[] = {std::byte{0}, std::byte{0xFF}, std::byte{0}, std::byte{7}};
  s->set(k2, binary);
  EXPECT_EQ(s->get(k2), Bytes(std::begin(binary), std::end(binary)));
  EXPECT_TRUE(s->check(both));
  s->set(k1, "");
  EXPECT_TRUE(s->get(k1).empty());
  EXPECT_TRUE(s->erase(k1));
  EXPECT_FALSE(s->erase(k1));
  EXPECT_FALSE(s->check(std::span(&k1, 1)));
}

TEST_P(StoreSemantics, GetWaitsForALaterSet) {
  auto getter = client();
  auto setter = client();
  std::thread t([&] { EXPECT_EQ(text(getter->get("later", 5s)), "value"); });
  if (is_tcp()) {
    EXPECT_TRUE(eventually([&] { return server_->waiting() == 1; }, 5s));
  }
  setter->set("later", "value");
  t.join();
}

TEST_P(StoreSemantics, AddCountsAndRefusesNonCounters) {
  auto s = client();
  EXPECT_EQ(s->add("n", 5), 5);
  EXPECT_EQ(s->add("n", -7), -2);
  EXPECT_EQ(s->add("n", 0), -2);
  EXPECT_EQ(s->get("n").size(), 8u);  // 8 little-endian bytes
  s->set("text", "abc");
  expect_error([&] { s->add("text", 1); }, Status::kInvalidArgument, "not a counter");
  // The store (and for TCP the connection) is still usable.
  EXPECT_EQ(s->add("n", 2), 0);
}

TEST_P(StoreSemantics, AddRefusesToOverflowTheCounter) {
  auto s = client();
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(s->add("big", kMax), kMax);
  expect_error([&] { s->add("big", 1); }, Status::kInvalidArgument, "overflow");
  EXPECT_EQ(s->add("big", 0), kMax);  // unchanged, and the store is still usable
  EXPECT_EQ(s->add("small", kMin), kMin);
  expect_error([&] { s->add("small", -1); }, Status::kInvalidArgument, "overflow");
  EXPECT_EQ(s->add("small", kMax), -1);
}

TEST_P(StoreSemantics, EmptyKeysAreInvalid) {
  auto s = client();
  expect_error([&] { s->set("", "x"); }, Status::kInvalidArgument, "empty key");
  expect_error([&] { s->get("", 10ms); }, Status::kInvalidArgument, "empty key");
  s->set("still", "works");
}

// Both stores accept and refuse the same keys and values: the TCP store's limits, checked
// before anything is allocated (a length of SIZE_MAX included).
TEST_P(StoreSemantics, BothStoresRefuseTheSameKeysAndValues) {
  auto s = client();
  const std::string longest(4096, 'k'), too_long(4097, 'k');
  s->set(longest, "fits");
  EXPECT_EQ(s->get(longest, 1s).size(), 4u);
  expect_error([&] { s->set(too_long, "x"); }, Status::kInvalidArgument,
               "key of 4097 bytes is longer than the limit of 4096");
  expect_error([&] { (void)s->get(too_long, 10ms); }, Status::kInvalidArgument,
               "key of 4097 bytes is longer than the limit of 4096");
  const std::byte one{1};
  const std::span<const std::byte> huge(&one, SIZE_MAX);  // never read: refused by its size
  expect_error([&] { s->set("huge", huge, 1s); }, Status::kInvalidArgument,
               "bytes is longer than the limit of 67108864");
  s->set("still", "works");
}

TEST_P(StoreSemantics, GetAndWaitTimeOutOnTime) {
  auto s = client();
  auto t0 = SteadyClock::now();
  expect_error([&] { s->get("missing-key", 300ms); }, Status::kTimeout, "missing-key");
  EXPECT_GE(since(t0), 300ms);
  EXPECT_LT(since(t0), 300ms + kSlack);

  // The timeout of a multi-key wait is for all keys together, and names the missing key.
  s->set("present", "1");
  const std::string keys[] = {"present", "absent-1", "absent-2", "absent-3"};
  t0 = SteadyClock::now();
  expect_error([&] { s->wait(keys, 300ms); }, Status::kTimeout, "absent-1");
  EXPECT_GE(since(t0), 300ms);
  EXPECT_LT(since(t0), 300ms + kSlack);

  // The client is still usable after a timeout.
  EXPECT_EQ(text(s->get("present")), "1");
  t0 = SteadyClock::now();
  expect_error([&] { s->get("missing-key", 0ms); }, Status::kTimeout, "missing-key");
  EXPECT_LT(since(t0), kSlack);
}

// 16 threads hammer one counter and exchange keys; every increment is seen exactly once.
TEST_P(StoreSemantics, ConcurrentClientsAddExactly) {
  constexpr int kThreads = 16;
  constexpr int kAdds = 100;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kThreads; ++i) clients.push_back(client());
  std::mutex mu;
  std::vector<std::int64_t> seen;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      try {
        Store& s = *clients[static_cast<std::size_t>(i)];
        std::vector<std::int64_t> mine;
        for (int k = 0; k < kAdds; ++k) mine.push_back(s.add("counter", 1));
        s.set("t/" + std::to_string(i), "from " + std::to_string(i));
        std::vector<std::string> keys;
        for (int j = 0; j < kThreads; ++j) keys.push_back("t/" + std::to_string(j));
        s.wait(keys, 10s);
        for (int j = 0; j < kThreads; ++j) {
          if (text(s.get(keys[static_cast<std::size_t>(j)])) != "from " + std::to_string(j))
            failures.fetch_add(1);
        }
        std::lock_guard lock(mu);
        seen.insert(seen.end(), mine.begin(), mine.end());
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << i << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // Every value 1..N was returned to exactly one add.
  std::sort(seen.begin(), seen.end());
  ASSERT_EQ(seen.size(), std::size_t{kThreads * kAdds});
  for (std::size_t i = 0; i < seen.size(); ++i)
    ASSERT_EQ(seen[i], static_cast<std::int64_t>(i + 1));
  EXPECT_EQ(clients[0]->add("counter", 0), kThreads * kAdds);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreSemantics, ::testing::Values("in_process", "tcp"),
                         [](const auto& info) { return std::string(info.param); });

// ---------------------------------------------------------------------------------------------
// TCP store: processes, failures, limits.

/// A store server in a process of its own, started before the test forks its clients: a child
/// forked while the test process runs the server's threads inherits whatever locks they hold (a
/// client under AddressSanitizer hung in its allocator, about 1 run in 50 on a loaded machine).
class ServerProcess {
 public:
  ServerProcess() {
    int fds[2] = {-1, -1};
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork_child([&] {
      ::close(fds[0]);
      TcpStoreServer server(TcpStoreServerConfig{});
      const int port = server.port();
      if (::write(fds[1], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) return;
      ::close(fds[1]);
      for (;;) ::pause();  // until the test kills it
    });
    ::close(fds[1]);
    if (::read(fds[0], &port_, sizeof(port_)) != static_cast<ssize_t>(sizeof(port_))) port_ = -1;
    ::close(fds[0]);
  }
  ~ServerProcess() {
    ::kill(pid_, SIGKILL);
    (void)wait_child(pid_, std::chrono::seconds(10));
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  [[nodiscard]] int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

TEST(TcpStore, ForkedProcessesShareTheStore) {
  constexpr int kProcs = 4;
  constexpr int kAdds = 100;
  const ServerProcess server;
  const int port = server.port();
  ASSERT_GT(port, 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    pids.push_back(fork_child([port, i] {
      TcpStore s(client_config(port));
      for (int k = 0; k < kAdds; ++k) s.add("procs/counter", 1);
      s.set("procs/" + std::to_string(i), "value " + std::to_string(i));
      std::vector<std::string> keys;
      for (int j = 0; j < kProcs; ++j) keys.push_back("procs/" + std::to_string(j));
      s.wait(keys, 10s);
      for (int j = 0; j < kProcs; ++j) {
        if (text(s.get(keys[static_cast<std::size_t>(j)])) != "value " + std::to_string(j))
          throw std::runtime_error("wrong value for " + keys[static_cast<std::size_t>(j)]);
      }
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(wait_child(pid, 20s), 0);
  TcpStore s(client_config(port));
  EXPECT_EQ(s.add("procs/counter", 0), kProcs * kAdds);
}

TEST(TcpStore, ClientDyingMidWaitReleasesItsServerThread) {
  TcpStoreServer server(TcpStoreServerConfig{});
  TcpStore observer(client_config(server.port()));
  observer.set("before", "1");
  ASSERT_EQ(server.connections(), 1);
  const int port = server.port();
  pid_t pid = fork_child([port] {
    TcpStore s(client_config(port));
    s.get("never-set", 60s);
  });
  ASSERT_TRUE(eventually([&] { return server.waiting() == 1; }, 5s));
  ASSERT_EQ(server.connections(), 2);
  ::kill(pid, SIGKILL);
  EXPECT_EQ(wait_child(pid, 5s), 128 + SIGKILL);
  // The server notices the hang-up within its poll interval, long before the 60 s timeout.
  EXPECT_TRUE(eventually([&] { return server.waiting() == 0 && server.connections() == 1; }, 2s))
      << "waiting " << server.waiting() << ", connections " << server.connections();
  EXPECT_EQ(text(observer.get("before")), "1");
  TcpStore after(client_config(port));
  EXPECT_EQ(text(after.get("before")), "1");
}

TEST(TcpStore, TokenIsRequiredWhenConfigured) {
  TcpStoreServerConfig config;
  config.token = "s3cret";
  TcpStoreServer server(config);
  expect_error([&] { TcpStore s(client_config(server.port())); }, Status::kInvalidArgument,
               "requires a token");
  expect_error([&] { TcpStore s(client_config(server.port(), "nope")); }, Status::kInvalidArgument,
               "wrong token");
  EXPECT_EQ(server.rejected_frames(), 2);
  TcpStore good(client_config(server.port(), "s3cret"));
  good.set("k", "v");
  EXPECT_EQ(text(good.get("k")), "v");
}

TEST(TcpStore, HostedServerUsesTheClientToken) {
  TcpStore::Config config;
  config.host_server = true;
  config.token = "t0ken";
  config.timeout = 5s;
  config.linger = 0ms;
  TcpStore host(config);
  host.set("shared", "yes");
  EXPECT_GT(host.port(), 0);
  TcpStore peer(client_config(host.port(), "t0ken"));
  EXPECT_EQ(text(peer.get("shared")), "yes");
  expect_error([&] { TcpStore s(client_config(host.port())); }, Status::kInvalidArgument, "token");
}

TEST(TcpStore, ConnectsToAServerThatStartsLater) {
  const int port = net::free_port();
  std::optional<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);  // the scenario: clients first, server later
    TcpStoreServerConfig config;
    config.port = port;
    server.emplace(config);
  });
  TcpStore client(client_config(port));
  starter.join();
  client.set("k", "v");
  EXPECT_EQ(text(client.get("k")), "v");
}

TEST(TcpStore, ConnectGivesUpAtItsTimeout) {
  TcpStore::Config config = client_config(net::free_port());
  config.timeout = 300ms;
  auto t0 = SteadyClock::now();
  expect_error([&] { TcpStore s(config); }, Status::kTimeout, "no store server");
  EXPECT_GE(since(t0), 300ms);
  EXPECT_LT(since(t0), 300ms + kSlack);
}

TEST(TcpStore, LostServerIsASystemError) {
  TcpStoreServer server(TcpStoreServerConfig{});
  TcpStore client(client_config(server.port()));
  client.set("k", "v");
  std::thread waiter([&] {
    auto t0 = SteadyClock::now();
    expect_error([&] { client.get("never", 10s); }, Status::kSystemError, "lost");
    EXPECT_LT(since(t0), 5s);
  });
  EXPECT_TRUE(eventually([&] { return server.waiting() == 1; }, 5s));
  server.stop();
  waiter.join();
  expect_error([&] { client.set("k", "v"); }, Status::kSystemError, "unusable");
}

// Ranks that are threads of one process may share a client: a GET waiting for a key leaves the
// connection free between its quarter-second waits, so the thread that sets the key gets its
// turn (it queued behind the GET until the GET's timeout before).
TEST(TcpStore, SharedClientTakesTurnsWithAWaitingGet) {
  TcpStoreServer server(TcpStoreServerConfig{});
  TcpStore shared(client_config(server.port()));
  std::string got;
  std::thread getter([&] { got = text(shared.get("k", 10s)); });
  EXPECT_TRUE(eventually([&] { return server.waiting() == 1; }, 5s));
  auto t0 = SteadyClock::now();
  shared.set("k", "v", 10s);
  EXPECT_LT(since(t0), 250ms + kSlack);
  getter.join();
  EXPECT_EQ(got, "v");
  EXPECT_LT(since(t0), 2 * (250ms + kSlack));
  // A WAIT too, and a GET that times out still names its key at its own timeout.
  std::thread waiter([&] { shared.wait(std::vector<std::string>{"w"}, 10s); });
  EXPECT_TRUE(eventually([&] { return server.waiting() == 1; }, 5s));
  shared.set("w", "1", 10s);
  waiter.join();
  t0 = SteadyClock::now();
  expect_error([&] { shared.get("never", 600ms); }, Status::kTimeout, "never");
  EXPECT_GE(since(t0), 600ms);
  EXPECT_LT(since(t0), 600ms + kSlack);
}

TEST(TcpStore, OversizedRequestsAreRefused) {
  TcpStoreServerConfig sc;
  sc.max_value_bytes = 1000;
  sc.max_key_bytes = 64;
  TcpStoreServer server(sc);
  // A client that knows the limits refuses locally and stays usable.
  TcpStore::Config knows = client_config(server.port());
  knows.server = sc;
  TcpStore careful(knows);
  expect_error([&] { careful.set("k", std::string(1001, 'x')); }, Status::kInvalidArgument,
               "longer than the limit of 1000");
  expect_error([&] { careful.get(std::string(65, 'k'), 10ms); }, Status::kInvalidArgument,
               "longer than the limit of 64");
  careful.set("k", std::string(1000, 'x'));
  EXPECT_EQ(server.rejected_frames(), 0);
  // A client with larger limits is refused by the server, and its connection is closed.
  TcpStore eager(client_config(server.port()));
  expect_error([&] { eager.set("k", std::string(1001, 'x')); }, Status::kInvalidArgument,
               "longer than 1000");
  EXPECT_EQ(server.rejected_frames(), 1);
  expect_error([&] { eager.set("k", "small"); }, Status::kSystemError, "unusable");
  EXPECT_EQ(text(careful.get("k")).size(), 1000u);
}

TEST(TcpStore, RefusesConnectionsBeyondTheLimit) {
  TcpStoreServerConfig sc;
  sc.max_connections = 2;
  TcpStoreServer server(sc);
  auto a = std::make_unique<TcpStore>(client_config(server.port()));
  TcpStore b(client_config(server.port()));
  // Refused until its deadline (it retries), then the refusal is reported.
  TcpStore::Config short_wait = client_config(server.port());
  short_wait.timeout = 300ms;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { TcpStore c(short_wait); }, Status::kUnavailable, "maximum of 2 connections");
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  a.reset();
  ASSERT_TRUE(eventually([&] { return server.connections() == 1; }, 2s));
  TcpStore d(client_config(server.port()));
  d.set("k", "v");
  EXPECT_EQ(text(b.get("k")), "v");
}

// A client refused as "busy" retries until its deadline: a slot freed meanwhile lets it in.
TEST(TcpStore, ABusyServerIsRetriedUntilTheDeadline) {
  TcpStoreServerConfig sc;
  sc.max_connections = 1;
  TcpStoreServer server(sc);
  auto holder = std::make_unique<TcpStore>(client_config(server.port()));
  std::thread release([&] {
    std::this_thread::sleep_for(300ms);
    holder.reset();
  });
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<TcpStore> late;
  try {
    late = std::make_unique<TcpStore>(client_config(server.port()));  // 5 s of deadline
  } catch (const Error& e) {
    ADD_FAILURE() << "refused at once: " << e.what();
  }
  release.join();
  ASSERT_NE(late, nullptr);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 250ms);
  late->set("k", "v");
  EXPECT_EQ(text(late->get("k")), "v");
}

// ---------------------------------------------------------------------------------------------
// Hostile input over raw sockets: each attack closes only its own connection.

class RawClient {
 public:
  explicit RawClient(int port) : sock_(net::connect_tcp("127.0.0.1", port, deadline_after(2s))) {}

  void send(std::span<const std::byte> data) {
    ASSERT_EQ(net::send_all(sock_.get(), data, deadline_after(2s)).status, net::Io::kOk);
  }
  void send_header(const wire::RequestHeader& h) { send(wire::encode(h)); }
  void hello(std::string_view token = "") {
    send_header({.opcode = wire::Opcode::kHello, .value_len = token.size()});
    send(std::as_bytes(std::span(token.data(), token.size())));
    auto r = read_reply();
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, wire::ReplyCode::kOk);
  }
  // The next reply and its payload as text; nullopt when the connection ended instead.
  std::optional<std::pair<wire::ReplyHeader, std::string>> read_reply() {
    wire::ReplyBytes b;
    if (net::recv_all(sock_.get(), b, deadline_after(5s)).status != net::Io::kOk)
      return std::nullopt;
    wire::ReplyHeader h = wire::decode_reply(b);
    if (h.value_len > 4096) return std::nullopt;
    std::string payload(h.value_len, '\0');
    if (net::recv_all(sock_.get(),
                      std::as_writable_bytes(std::span(payload.data(), payload.size())),
                      deadline_after(5s))
            .status != net::Io::kOk)
      return std::nullopt;
    return std::pair{h, payload};
  }
  // True when the server closes the connection within 5 s.
  bool closed_by_server() {
    std::byte b[64];
    for (;;) {
      net::IoResult r = net::recv_all(sock_.get(), std::span(b, 1), deadline_after(5s));
      if (r.status == net::Io::kClosed) return true;
      if (r.status != net::Io::kOk) return false;
    }
  }
  void shutdown_write() { ::shutdown(sock_.get(), SHUT_WR); }
  void close() { sock_.reset(); }

 private:
  net::Socket sock_;
};

class HostileInput : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerConfig config;
    config.frame_timeout = 300ms;
    config.hello_timeout = 300ms;
    config.max_key_bytes = 256;
    config.max_value_bytes = 1 << 20;
    server_.emplace(config);
    before_.emplace(client_config(server_->port()));
    before_->set("before", "1");
  }

  // Runs `attack`; expects an error reply with `code` (unless nullopt), the connection closed,
  // one more rejected frame, and well-behaved clients (one connected before, one after) served.
  void expect_rejected(const std::function<void(RawClient&)>& attack,
                       std::optional<wire::ReplyCode> code) {
    const std::int64_t rejected = server_->rejected_frames();
    RawClient raw(server_->port());
    attack(raw);
    if (code) {
      auto reply = raw.read_reply();
      ASSERT_TRUE(reply.has_value()) << "no error reply";
      EXPECT_EQ(reply->first.code, *code) << reply->second;
      EXPECT_FALSE(reply->second.empty());
      EXPECT_TRUE(raw.closed_by_server());
    }
    EXPECT_TRUE(eventually([&] { return server_->rejected_frames() == rejected + 1; }, 5s))
        << server_->rejected_frames() << " rejected frames, expected " << rejected + 1;
    EXPECT_EQ(text(before_->get("before")), "1");
    EXPECT_EQ(before_->add("served", 1), ++served_);
    TcpStore after(client_config(server_->port()));
    EXPECT_EQ(text(after.get("before")), "1");
  }

  std::optional<TcpStoreServer> server_;
  std::optional<TcpStore> before_;
  std::int64_t served_ = 0;
};

TEST_F(HostileInput, TruncatedFrameThenClose) {
  expect_rejected(
      [](RawClient& raw) {
        auto h = wire::encode(wire::RequestHeader{.opcode = wire::Opcode::kHello});
        raw.send(std::span(h.data(), 10));
        raw.close();
      },
      std::nullopt);
}

TEST_F(HostileInput, TruncatedPayloadThenHalfClose) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header({.opcode = wire::Opcode::kSet, .key_len = 3, .value_len = 100});
        raw.send(std::as_bytes(std::span("key-and-a-bit", 13)));
        raw.shutdown_write();
      },
      wire::ReplyCode::kProtocolError);
}

TEST_F(HostileInput, HugeLengthPrefix) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header(
            {.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = std::uint64_t{1} << 40});
      },
      wire::ReplyCode::kTooLarge);
}

TEST_F(HostileInput, HugeKey) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header({.opcode = wire::Opcode::kGet, .key_len = 0xFFFFFFFF});
      },
      wire::ReplyCode::kTooLarge);
}

TEST_F(HostileInput, WrongMagic) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header({.magic = 0x12345678, .opcode = wire::Opcode::kCheck, .key_len = 1});
      },
      wire::ReplyCode::kProtocolError);
}

TEST_F(HostileInput, UnknownOpcode) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header({.opcode = static_cast<wire::Opcode>(42), .key_len = 1});
      },
      wire::ReplyCode::kProtocolError);
}

TEST_F(HostileInput, NoHelloFirst) {
  expect_rejected(
      [](RawClient& raw) {
        raw.send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = 1});
        raw.send(std::as_bytes(std::span("kv", 2)));
      },
      wire::ReplyCode::kUnauthenticated);
}

TEST_F(HostileInput, WrongToken) {
  // This fixture's server has no token: any token but the empty one is wrong.
  expect_rejected(
      [](RawClient& raw) {
        raw.send_header({.opcode = wire::Opcode::kHello, .value_len = 4});
        raw.send(std::as_bytes(std::span("oops", 4)));
      },
      wire::ReplyCode::kUnauthenticated);
}

TEST_F(HostileInput, GarbageBytes) {
  expect_rejected(
      [](RawClient& raw) {
        std::mt19937 rng(42);
        std::vector<std::byte> junk(200);
        for (auto& b : junk) b = static_cast<std::byte>(rng());
        raw.send(junk);
      },
      wire::ReplyCode::kProtocolError);
}

TEST_F(HostileInput, StalledFrameIsDroppedAfterTheFrameTimeout) {
  auto t0 = SteadyClock::now();
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        auto h = wire::encode(wire::RequestHeader{.opcode = wire::Opcode::kGet, .key_len = 1});
        raw.send(std::span(h.data(), 20));
      },
      wire::ReplyCode::kProtocolError);
  EXPECT_GE(since(t0), 300ms);
}

TEST_F(HostileInput, SilentConnectionIsDroppedBeforeHello) {
  auto t0 = SteadyClock::now();
  expect_rejected([](RawClient&) {}, wire::ReplyCode::kUnauthenticated);
  EXPECT_GE(since(t0), 300ms);
}

TEST_F(HostileInput, SecondHello) {
  expect_rejected(
      [](RawClient& raw) {
        raw.hello();
        raw.send_header({.opcode = wire::Opcode::kHello});
      },
      wire::ReplyCode::kProtocolError);
}

// ---------------------------------------------------------------------------------------------
// What clients can make the server hold (NOTE [store memory bounds]).

constexpr std::size_t kMiB = std::size_t{1} << 20;

// This process's resident memory, in bytes (the servers under test run in it).
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0;
  std::int64_t resident = 0;
  statm >> pages >> resident;
  return resident * ::sysconf(_SC_PAGESIZE);
}

std::span<const std::byte> bytes_of(std::string_view s) { return wire::as_bytes(s); }

// Headers that announce large values cost the server nothing until the bytes arrive.
TEST(StoreLimits, AnnouncedPayloadIsNotAllocatedBeforeItArrives) {
  constexpr int kClients = 16;
  TcpStoreServerConfig sc;
  sc.max_value_bytes = 16 * kMiB;
  TcpStoreServer server(sc);
  const std::int64_t before = resident_bytes();
  std::vector<std::unique_ptr<RawClient>> raws;
  for (int i = 0; i < kClients; ++i) {
    raws.push_back(std::make_unique<RawClient>(server.port()));
    raws.back()->hello();
    raws.back()->send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = 16 * kMiB});
    raws.back()->send(bytes_of("k"));
  }
  ASSERT_TRUE(eventually([&] { return server.connections() == kClients; }, 5s));
  std::this_thread::sleep_for(300ms);  // every header has been read
  // Before: 16 x 16 MiB allocated and zero-filled.
  EXPECT_LT(resident_bytes() - before, std::int64_t{32} << 20);
  // One of them sends its value after all, and it is stored.
  Bytes value(16 * kMiB);
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<std::byte>(i % 251);
  raws[0]->send(value);
  auto go = raws[0]->read_reply();  // sent when the header came (NOTE [store wire format] 5)
  ASSERT_TRUE(go.has_value());
  EXPECT_EQ(go->first.code, wire::ReplyCode::kGoAhead);
  auto reply = raws[0]->read_reply();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->first.code, wire::ReplyCode::kOk);
  TcpStore::Config cc = client_config(server.port());
  cc.server = sc;
  TcpStore reader(cc);
  EXPECT_TRUE(reader.get("k") == value);
}

TEST(StoreLimits, BytesInFlightAreCappedOverAllConnections) {
  TcpStoreServerConfig sc;
  sc.max_key_bytes = 64;
  sc.max_value_bytes = kMiB;
  sc.max_inflight_bytes = 2 * kMiB;
  TcpStoreServer server(sc);
  const Bytes almost(kMiB - 1, std::byte{7});
  // `a` holds 1 MiB + 1 byte in flight (its whole request, from its header on): it has sent all
  // of its value but one byte, after the go-ahead (NOTE [store wire format] 5).
  RawClient a(server.port());
  a.hello();
  a.send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB});
  a.send(bytes_of("a"));
  auto go = a.read_reply();
  ASSERT_TRUE(go.has_value());
  ASSERT_EQ(go->first.code, wire::ReplyCode::kGoAhead);
  a.send(almost);
  ASSERT_TRUE(eventually([&] { return server.inflight_bytes() == kMiB + 1; }, 5s))
      << server.inflight_bytes();
  // `b`'s value does not fit beside it: refused before it is sent; `b` stays connected.
  RawClient b(server.port());
  b.hello();
  b.send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB});
  b.send(bytes_of("b"));
  auto refused = b.read_reply();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->first.code, wire::ReplyCode::kOverLimit);
  EXPECT_EQ(refused->first.result, wire::kRetryLater);  // the client may send it again
  EXPECT_NE(refused->second.find("max_inflight_bytes of 2097152"), std::string::npos)
      << refused->second;
  EXPECT_LE(server.inflight_bytes(), 2 * kMiB);
  EXPECT_EQ(server.rejected_frames(), 1);
  b.send_header({.opcode = wire::Opcode::kCheck, .key_len = 1});
  b.send(bytes_of("b"));
  auto check = b.read_reply();
  ASSERT_TRUE(check.has_value());
  EXPECT_EQ(check->first.code, wire::ReplyCode::kOk);
  EXPECT_EQ(check->first.result, 0);
  // `a` finishes; everything it held is given back, and a client can store 1 MiB again.
  a.send(std::span(almost.data(), 1));
  auto stored = a.read_reply();
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->first.code, wire::ReplyCode::kOk);
  EXPECT_TRUE(eventually([&] { return server.inflight_bytes() == 0; }, 5s));
  TcpStore::Config cc = client_config(server.port());
  cc.server = sc;
  TcpStore c(cc);
  c.set("c", std::string(kMiB, 'c'));
  EXPECT_EQ(text(c.get("a")).size(), kMiB);
}

// A client over the bytes in flight waits its turn: its SET is sent again until another
// request gives its bytes back, within the SET's timeout (8 ranks sending their IPC handles at
// once must not fail for no fault of their own).
TEST(StoreLimits, ARequestOverTheBytesInFlightWaitsItsTurn) {
  TcpStoreServerConfig sc;
  sc.max_value_bytes = kMiB;
  sc.max_key_bytes = 64;
  sc.max_inflight_bytes = kMiB + 64;
  TcpStoreServer server(sc);
  RawClient holder(server.port());
  holder.hello();
  holder.send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB});
  holder.send(bytes_of("h"));
  auto go = holder.read_reply();
  ASSERT_TRUE(go.has_value());
  ASSERT_EQ(go->first.code, wire::ReplyCode::kGoAhead);
  holder.send(Bytes(512 << 10));
  // Its whole request is counted from its header on, so the retries below cannot take its room
  // while its second half is on the way.
  ASSERT_TRUE(eventually([&] { return server.inflight_bytes() == kMiB + 1; }, 5s))
      << server.inflight_bytes();
  TcpStore::Config cc = client_config(server.port());
  cc.server = sc;
  TcpStore c(cc);
  std::thread finish([&] {
    std::this_thread::sleep_for(300ms);
    holder.send(Bytes(512 << 10));  // the holder's SET completes and gives its bytes back
  });
  const auto start = std::chrono::steady_clock::now();
  c.set("big", std::string(kMiB, 'x'), 10s);
  finish.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  EXPECT_EQ(text(c.get("big")).size(), kMiB);
  const auto stored = holder.read_reply();
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->first.code, wire::ReplyCode::kOk);
}

// A client still over the bytes in flight when its timeout ends gets an error naming the limit
// and keeps its connection.
TEST(StoreLimits, OverLimitIsAnErrorNamingTheLimit) {
  TcpStoreServerConfig sc;
  sc.max_value_bytes = kMiB;
  sc.max_key_bytes = 64;
  sc.max_inflight_bytes = kMiB + 64;
  TcpStoreServer server(sc);
  RawClient holder(server.port());
  holder.hello();
  holder.send_header({.opcode = wire::Opcode::kSet, .key_len = 1, .value_len = kMiB});
  holder.send(bytes_of("h"));
  auto go = holder.read_reply();
  ASSERT_TRUE(go.has_value());
  ASSERT_EQ(go->first.code, wire::ReplyCode::kGoAhead);
  holder.send(Bytes(512 << 10));
  ASSERT_TRUE(eventually([&] { return server.inflight_bytes() >= (512 << 10); }, 5s));
  TcpStore::Config cc = client_config(server.port());
  cc.server = sc;
  TcpStore c(cc);
  const auto start = std::chrono::steady_clock::now();
  expect_error([&] { c.set("big", std::string(kMiB, 'x'), 500ms); }, Status::kUnavailable,
               "max_inflight_bytes");
  // It waited its turn, in vain, leaving time for its last attempt.
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  c.set("small", "1");
  EXPECT_EQ(text(c.get("small")), "1");
}

// 20 clients GETting a 64 MiB value without reading held 1.3-1.8 GB for ~12 s. Now the copies
// in flight are capped, and a client that does not read its reply is dropped within about a
// second of stalling.
TEST(StoreLimits, ClientsThatDoNotReadTheirRepliesHoldLittleForLong) {
  constexpr int kReaders = 6;
  constexpr std::size_t kValue = 24 * kMiB;
  TcpStoreServerConfig sc;
  sc.max_value_bytes = kValue;
  sc.max_inflight_bytes = 2 * kValue + 4096;
  TcpStoreServer server(sc);
  TcpStore::Config cc = client_config(server.port());
  cc.server = sc;
  TcpStore writer(cc);
  Bytes value(kValue);
  for (std::size_t i = 0; i < value.size(); ++i) value[i] = static_cast<std::byte>(i % 253);
  writer.set("big", value);
  std::vector<std::unique_ptr<RawClient>> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.push_back(std::make_unique<RawClient>(server.port()));
    readers.back()->hello();
    readers.back()->send_header({.opcode = wire::Opcode::kGet, .key_len = 3, .arg = 1000});
    readers.back()->send(bytes_of("big"));
  }
  const auto t0 = SteadyClock::now();
  std::size_t most = 0;
  while (since(t0) < 4s && (server.inflight_bytes() != 0 || server.rejected_frames() < kReaders)) {
    most = std::max(most, server.inflight_bytes());
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_LE(most, sc.max_inflight_bytes);
  EXPECT_EQ(server.inflight_bytes(), 0u) << "still held after " << since(t0).count() << " ms";
  // Two were dropped for not reading, four refused for want of room.
  EXPECT_EQ(server.rejected_frames(), kReaders);
  EXPECT_TRUE(writer.get("big") == value);
}

TEST(StoreLimits, StoredKeysAndBytesAreCapped) {
  TcpStoreServerConfig sc;
  sc.max_keys = 3;
  sc.max_stored_bytes = 100;
  TcpStoreServer server(sc);
  TcpStore c(client_config(server.port()));
  c.set("a", "12345");          // 6 bytes
  c.set("b", "1");              // 2 bytes
  EXPECT_EQ(c.add("n", 1), 1);  // 9 bytes
  EXPECT_EQ(server.stored_bytes(), 17u);
  expect_error([&] { c.set("d", "1"); }, Status::kUnavailable, "max_keys of 3");
  expect_error([&] { c.add("m", 1); }, Status::kUnavailable, "max_keys of 3");
  c.set("a", "x");  // replacing a key is no new key
  EXPECT_EQ(server.stored_bytes(), 13u);
  expect_error([&] { c.set("a", std::string(89, 'x')); }, Status::kUnavailable,
               "max_stored_bytes of 100");
  EXPECT_EQ(text(c.get("a")), "x");
  c.set("a", std::string(88, 'x'));  // exactly 100 bytes stored
  EXPECT_EQ(server.stored_bytes(), 100u);
  EXPECT_TRUE(c.erase("b"));
  EXPECT_EQ(server.stored_bytes(), 98u);
  c.set("d", "");
  EXPECT_EQ(server.stored_bytes(), 99u);
  EXPECT_EQ(c.add("n", 1), 2);
  EXPECT_EQ(server.rejected_frames(), 3);
}

// 1030 connections that never said HELLO filled every slot; a client with the token was then
// refused as busy. Now they have their own small limit, and each new connection beyond it
// displaces the oldest of them: the token holder gets in at once.
TEST(StoreLimits, SilentConnectionsCannotKeepATokenHolderOut) {
  constexpr int kSilent = 12;
  TcpStoreServerConfig sc;
  sc.token = "secret";
  sc.max_connections = 8;
  sc.max_unauthenticated = 4;
  sc.hello_timeout = 20s;
  TcpStoreServer server(sc);
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < kSilent; ++i) silent.push_back(std::make_unique<RawClient>(server.port()));
  // Every one past the fourth displaced the oldest: the first eight are closed, without a reply.
  ASSERT_TRUE(eventually([&] { return server.displaced_connections() == kSilent - 4; }, 5s))
      << server.displaced_connections();
  for (int i = 0; i < kSilent - 4; ++i)
    EXPECT_TRUE(silent[static_cast<std::size_t>(i)]->closed_by_server()) << i;
  EXPECT_TRUE(eventually([&] { return server.connections() == 4; }, 5s)) << server.connections();
  // The token holder takes the place of the oldest that is left, at once.
  TcpStore::Config cc = client_config(server.port(), "secret");
  cc.timeout = 3s;
  const auto start = SteadyClock::now();
  TcpStore c(cc);
  c.set("k", "v");
  EXPECT_EQ(text(c.get("k")), "v");
  EXPECT_LT(SteadyClock::now() - start, 1s);
  EXPECT_TRUE(silent[kSilent - 4]->closed_by_server());
  EXPECT_TRUE(eventually([&] { return server.connections() == 4; }, 5s)) << server.connections();
  EXPECT_EQ(server.rejected_frames(), 0);
}

// Silent connections opened and closed again and again, always more of them open than
// `max_unauthenticated`, each far younger than a second: a client with the token still gets in
// at once (it used to be refused as busy, again and again).
TEST(StoreLimits, ChurningSilentConnectionsCannotKeepATokenHolderOut) {
  TcpStoreServerConfig sc;
  sc.token = "secret";
  sc.max_unauthenticated = 4;
  sc.hello_timeout = 20s;
  TcpStoreServer server(sc);
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> opened{0};
  std::vector<std::thread> crowd;
  struct Joined {  // the crowd stops, whatever ends the test
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Joined() {
      stop.store(true);
      for (auto& t : threads) t.join();
    }
  } joined{stop, crowd};
  // Each of 8 threads keeps two connections and replaces the older one every 5 ms: the store
  // always has more silent connections than it lets wait, none of them older than 10 ms.
  for (int t = 0; t < 8; ++t) {
    crowd.emplace_back([&] {
      std::deque<std::unique_ptr<RawClient>> open;
      while (!stop.load()) {
        try {
          open.push_back(std::make_unique<RawClient>(server.port()));
          opened.fetch_add(1);
        } catch (const Error&) {
          // refused for a moment: the listen queue is full
        }
        if (open.size() > 2) open.pop_front();  // closes the oldest of this thread's
        std::this_thread::sleep_for(5ms);
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return opened.load() > 40; }, 10s)) << opened.load();
  // The crowd is over the limit: it displaces its own (on a loaded machine it may take a while
  // to get there).
  ASSERT_TRUE(eventually([&] { return server.displaced_connections() > 0; }, 10s));
  TcpStore::Config cc = client_config(server.port(), "secret");
  cc.timeout = 5s;
  const auto start = SteadyClock::now();
  try {
    TcpStore c(cc);
    c.set("k", "v");
    EXPECT_EQ(text(c.get("k")), "v");
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  const auto took = SteadyClock::now() - start;
  EXPECT_LT(took, 1s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
}

// Clients that connect all at once, more than `max_unauthenticated`, are slowed (refused as busy,
// which they retry), never cut off.
TEST(StoreLimits, ACrowdConnectingAtOnceGetsIn) {
  constexpr int kClients = 16;
  TcpStoreServerConfig sc;
  sc.token = "secret";
  sc.max_unauthenticated = 2;
  TcpStoreServer server(sc);
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&] {
      try {
        TcpStore c(client_config(server.port(), "secret"));
        c.add("n", 1);
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        failed.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  TcpStore c(client_config(server.port(), "secret"));
  EXPECT_EQ(c.add("n", 0), kClients);
  EXPECT_EQ(server.rejected_frames(), 0);
}

// ---------------------------------------------------------------------------------------------
// Random and mutated frames: the server stays up, serves a well-formed client afterwards, and
// holds nothing for them once they are gone.

// A request's bytes: header, key, value.
Bytes frame_bytes(const wire::RequestHeader& h, std::string_view key,
                  std::span<const std::byte> value) {
  const auto hb = wire::encode(h);
  Bytes out(hb.size() + key.size() + value.size());
  std::memcpy(out.data(), hb.data(), hb.size());
  if (!key.empty()) std::memcpy(out.data() + hb.size(), key.data(), key.size());
  if (!value.empty()) std::memcpy(out.data() + hb.size() + key.size(), value.data(), value.size());
  return out;
}

TEST(StoreFuzz, RandomAndMutatedFramesLeaveTheServerServing) {
  TcpStoreServerConfig sc;
  sc.token = "fuzz";
  sc.frame_timeout = 200ms;
  sc.hello_timeout = 200ms;
  sc.max_key_bytes = 64;
  sc.max_value_bytes = 4096;
  sc.max_inflight_bytes = 16 << 10;
  sc.max_keys = 64;
  sc.max_stored_bytes = 16 << 10;
  sc.world_size = 4;  // claims and watches of ranks 0..3 are taken (with the claim's secret)
  TcpStoreServer server(sc);
  TcpStore::Config cc = client_config(server.port(), "fuzz");
  cc.server = sc;
  {
    TcpStore before(cc);
    before.set("before", "kept");
    EXPECT_EQ(before.add("n", 1), 1);
  }
  const LogLevel level = log::level();
  log::set_level(LogLevel::kOff);  // thousands of rejections
  const std::int64_t rss_before = resident_bytes();
  std::mt19937_64 rng(20261203);
  auto pick = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
  auto frame = [&]() {
    const auto op = static_cast<wire::Opcode>(1 + pick(9));
    std::string key(pick(4) == 0 ? 0 : 1 + pick(16), 'k');
    for (char& ch : key) ch = static_cast<char>('a' + pick(4));
    Bytes value(op == wire::Opcode::kSet || op == wire::Opcode::kHello ? pick(64)
                : op == wire::Opcode::kWatch && pick(2) == 0           ? wire::kWatchSecretBytes
                                                                       : 0);
    for (auto& v : value) v = static_cast<std::byte>(rng());
    if (op == wire::Opcode::kHello && pick(2) == 0) {
      auto token = bytes_of("fuzz");
      value.assign(token.begin(), token.end());
    }
    wire::RequestHeader h{.opcode = op,
                          .key_len = static_cast<std::uint32_t>(key.size()),
                          .value_len = value.size(),
                          .arg = static_cast<std::int64_t>(pick(6)) - 1};
    return frame_bytes(h, key, value);
  };
  const Bytes hello =
      frame_bytes({.opcode = wire::Opcode::kHello, .value_len = 4}, "", bytes_of("fuzz"));
  int connections = 0;
  const auto t0 = SteadyClock::now();
  while (since(t0) < 1500ms) {
    net::Socket s = net::connect_tcp("127.0.0.1", server.port(), deadline_after(2s));
    ++connections;
    Bytes stream;
    if (pick(5) != 0) stream = hello;
    for (std::size_t n = 1 + pick(4); n > 0; --n) {
      Bytes f = pick(8) == 0 ? Bytes(1 + pick(200)) : frame();
      if (f.size() > 0 && pick(2) == 0) {
        for (std::size_t m = 1 + pick(3); m > 0; --m) f[pick(f.size())] = std::byte(rng());
      }
      if (pick(4) == 0) f.resize(pick(f.size() + 1));  // cut off
      if (pick(16) == 0) {                             // a huge announced value
        auto big = wire::encode(wire::RequestHeader{
            .opcode = wire::Opcode::kSet, .key_len = 1, .value_len = rng() >> pick(64)});
        f.assign(big.begin(), big.end());
      }
      stream.insert(stream.end(), f.begin(), f.end());
    }
    (void)net::send_all(s.get(), stream, deadline_after(200ms));
    if (pick(2) == 0) {
      // Read what comes back for a moment, like a client that waits for its replies.
      std::byte sink[4096];
      (void)net::wait_readable(s.get(), deadline_after(5ms));
      (void)::recv(s.get(), sink, sizeof(sink), MSG_DONTWAIT);
    }
    if (pick(2) == 0) ::shutdown(s.get(), SHUT_WR);
  }
  log::set_level(level);
  EXPECT_GT(connections, 100);
  EXPECT_GT(server.rejected_frames(), connections / 2);
  EXPECT_TRUE(server.wait_idle(5s)) << server.connections() << " connections left";
  EXPECT_EQ(server.inflight_bytes(), 0u);
  EXPECT_LE(server.stored_bytes(), sc.max_stored_bytes);
  EXPECT_LT(resident_bytes() - rss_before, std::int64_t{64} << 20);
  // Keys of the fuzzer's frames are made of a-d: these two are out of its reach.
  TcpStore c(cc);
  EXPECT_EQ(text(c.get("before")), "kept");
  EXPECT_EQ(c.add("n", 1), 2);
}

}  // namespace
}  // namespace tpcomm
