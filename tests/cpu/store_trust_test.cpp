// SPDX-License-Identifier: Apache-2.0
// The store's trust model: a client that is no rank cannot watch as one, keep one out or make
// one look lost (NOTE [rank watch]); a store open to the network without a token is refused
// where asked; what the store holds for strangers is bounded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/deadline.hpp"
#include "bootstrap/rank_watch.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "support/child.hpp"
#include "support/raw_store.hpp"
#include "support/run_program.hpp"
#include "support/watched_store.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::eventually;
using testing::raw_claim;
using testing::raw_hello;
using testing::raw_watch_with;
using wire::ReplyCode;

using testing::Heard;
using testing::job;
using testing::watched;

// A secret that no claim returned.
const std::vector<std::byte> kGuessed(wire::kWatchSecretBytes, std::byte{0x5a});

// Waits for a key that is never set: a lost rank would fail it at once with kAborted.
void expect_waits_run_to_their_deadline(TcpStore& s) {
  try {
    s.get("never-set", 300ms);
    ADD_FAILURE() << "a get of a key never set returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout) << e.what();
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A client that watches rank 1 before rank 1 starts used to take its place: rank 1 failed (a
// protocol error, no reason), and closing the client aborted rank 0. Now a watch needs the
// secret of the rank's own claim: the stranger is refused, saying why, rank 1 starts, and the
// stranger's leaving loses nothing.
TEST(StoreTrust, AWatchBeforeTheRankStartsTakesNothing) {
  TcpStoreServer server(job(2));
  auto s0 = watched(server.port(), 0, 5s);
  Heard heard;
  const auto id = s0->rank_watch()->subscribe(heard.callback());
  {
    net::Socket stranger = raw_hello(server.port());
    const auto r = raw_watch_with(stranger.get(), 1, kGuessed);
    EXPECT_EQ(r.header.code, ReplyCode::kRefused) << r.text();
    EXPECT_TRUE(contains(r.text(), "rank 1 has not claimed")) << r.text();
    std::shared_ptr<TcpStore> s1;
    try {
      s1 = watched(server.port(), 1, 5s);
    } catch (const Error& e) {
      ADD_FAILURE() << "rank 1 was kept out: " << e.what();
    }
    ASSERT_NE(s1, nullptr);
    EXPECT_NE(s1->rank_watch(), nullptr);
    // Rank 1's place is its own now: another claim is refused, naming who holds it.
    net::Socket second = raw_hello(server.port());
    const auto c = raw_claim(second.get(), 1);
    EXPECT_EQ(c.header.code, ReplyCode::kRefused);
    EXPECT_TRUE(contains(c.text(), "rank 1 is held by the connection from 127.0.0.1:")) << c.text();
  }  // the stranger closes; rank 1 leaves normally
  EXPECT_FALSE(heard.wait(300ms)) << heard.reason();
  expect_waits_run_to_their_deadline(*s0);
  s0->rank_watch()->unsubscribe(id);
}

// A rank held by another connection: the client's error carries the store's reason.
TEST(StoreTrust, ARefusedClaimNamesItsReasonToTheClient) {
  TcpStoreServer server(job(2));
  net::Socket holder = raw_hello(server.port());
  ASSERT_EQ(raw_claim(holder.get(), 1).header.code, ReplyCode::kOk);
  try {
    watched(server.port(), 1, 5s);
    ADD_FAILURE() << "two clients hold rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
    EXPECT_TRUE(contains(e.what(), "rank 1 is held by the connection from")) << e.what();
  }
  // A claim whose connection closes before its watch is given back.
  holder.reset();
  EXPECT_TRUE(eventually(
      [&] {
        try {
          watched(server.port(), 1, 5s).reset();
          return true;
        } catch (const Error&) {
          return false;
        }
      },
      5s));
}

// After rank 1 left normally, `WATCH 1` and a close aborted rank 0's waits. Now a rank that
// left cannot be claimed or watched again.
TEST(StoreTrust, AWatchAfterTheRankLeftLosesNothing) {
  TcpStoreServer server(job(2));
  auto s0 = watched(server.port(), 0, 5s);
  Heard heard;
  const auto id = s0->rank_watch()->subscribe(heard.callback());
  watched(server.port(), 1, 5s).reset();  // leaves normally
  ASSERT_TRUE(eventually([&] { return server.connections() == 2; }, 5s));
  {
    net::Socket stranger = raw_hello(server.port());
    const auto c = raw_claim(stranger.get(), 1);
    EXPECT_EQ(c.header.code, ReplyCode::kRefused);
    EXPECT_TRUE(contains(c.text(), "rank 1 left the job")) << c.text();
    const auto w = raw_watch_with(stranger.get(), 1, kGuessed);
    EXPECT_EQ(w.header.code, ReplyCode::kRefused) << w.text();
  }
  EXPECT_FALSE(heard.wait(300ms)) << heard.reason();
  expect_waits_run_to_their_deadline(*s0);
  s0->rank_watch()->unsubscribe(id);
}

// With TPCOMM_RANK_WATCH=0 the store held no place at all, and `WATCH 1` and a close aborted a
// running job. Now rank 0's store, which knows the job does not watch, refuses every claim.
TEST(StoreTrust, AJobThatDoesNotWatchTakesNoWatch) {
  const int port = net::free_port();
  std::vector<std::optional<Error>> errors(2);
  std::atomic<int> up{0};
  std::atomic<bool> go_on{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      LaunchInfo info;
      info.rank = r;
      info.world_size = 2;
      info.store_port = port;
      Options o;
      o.rank_watch = false;
      o.timeout_ms = 5000;
      try {
        Bootstrap b = Bootstrap::from_launch_info(info, o);
        b.barrier();
        up.fetch_add(1);
        while (!go_on.load()) std::this_thread::sleep_for(1ms);
        b.barrier();
        (void)b.store().get("never-set", 300ms);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = e;
      }
    });
  }
  ASSERT_TRUE(eventually([&] { return up.load() == 2; }, 10s));
  {
    net::Socket stranger = raw_hello(port);
    const auto c = raw_claim(stranger.get(), 1);
    EXPECT_EQ(c.header.code, ReplyCode::kRefused);
    EXPECT_TRUE(contains(c.text(), "TPCOMM_RANK_WATCH=0")) << c.text();
    const auto w = raw_watch_with(stranger.get(), 1, kGuessed);
    EXPECT_EQ(w.header.code, ReplyCode::kRefused) << w.text();
  }
  go_on.store(true);
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const auto& e = errors[static_cast<std::size_t>(r)];
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->status(), Status::kTimeout) << e->what();  // not kAborted
  }
}

// `tpcomm store` knew no world size: `WATCH 1000000` and a close failed every later wait. A
// store takes watches of its job's ranks only, and one that does not know the job takes none.
TEST(StoreTrust, WatchesPastTheWorldSizeAreRefused) {
  TcpStoreServer server(job(2));
  net::Socket stranger = raw_hello(server.port());
  for (std::int64_t rank : {2, 1000000}) {
    const auto c = raw_claim(stranger.get(), rank);
    EXPECT_EQ(c.header.code, ReplyCode::kRefused);
    EXPECT_TRUE(contains(c.text(), "is not a rank of this job (world size 2)")) << c.text();
  }
  const auto w = raw_watch_with(stranger.get(), 1000000, kGuessed);
  EXPECT_EQ(w.header.code, ReplyCode::kRefused) << w.text();

  TcpStoreServer unknown(TcpStoreServerConfig{});
  try {
    watched(unknown.port(), 0, 5s);
    ADD_FAILURE() << "a store that does not know its world took a watch";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
    EXPECT_TRUE(contains(e.what(), "--world-size")) << e.what();
  }
}

// The same through `tpcomm store`, with and without --world-size.
TEST(StoreTrust, TheStoreCommandTakesWatchesOfItsWorldOnly) {
  for (const bool with_world : {false, true}) {
    SCOPED_TRACE(with_world);
    const int port = net::free_port();
    const std::string port_text = std::to_string(port);
    const pid_t host = testing::fork_child([&] {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      if (with_world) {
        ::execl(TPCOMM_CLI_PATH, TPCOMM_CLI_PATH, "store", "--port", port_text.c_str(),
                "--world-size", "2", static_cast<char*>(nullptr));
      } else {
        ::execl(TPCOMM_CLI_PATH, TPCOMM_CLI_PATH, "store", "--port", port_text.c_str(),
                static_cast<char*>(nullptr));
      }
      throw std::runtime_error("cannot run " TPCOMM_CLI_PATH);
    });
    {
      net::Socket stranger = raw_hello(port);
      const auto far = raw_claim(stranger.get(), 1000000);
      EXPECT_EQ(far.header.code, ReplyCode::kRefused) << far.text();
      const auto one = raw_claim(stranger.get(), 1);
      EXPECT_EQ(one.header.code, with_world ? ReplyCode::kOk : ReplyCode::kRefused) << one.text();
    }
    ::kill(host, SIGTERM);
    EXPECT_EQ(testing::wait_child(host, 5s), 0);
  }
}

// A store that other machines could reach without a token: rank 0 only warned. With
// TPCOMM_STORE_REQUIRE_TOKEN=1 it refuses to start, before binding anything; `tpcomm store`
// refuses unless --insecure is given. (The wildcard address is refused before it is bound.)
TEST(StoreTrust, ATokenlessStoreOffLoopbackIsRefusedWhereAsked) {
  Options o = Options::from_lookup([](const char* name) -> std::optional<std::string> {
    if (std::string_view(name) == "TPCOMM_STORE_REQUIRE_TOKEN") return "1";
    return std::nullopt;
  });
  EXPECT_TRUE(o.store_require_token);
  EXPECT_FALSE(Options{}.store_require_token);
  o.store_bind = "0.0.0.0";
  o.timeout_ms = 2000;
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.store_port = net::free_port();
  try {
    (void)Bootstrap::from_launch_info(info, o);
    ADD_FAILURE() << "rank 0 hosted a tokenless store on 0.0.0.0";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
    EXPECT_TRUE(contains(e.what(), "TPCOMM_STORE_REQUIRE_TOKEN=1")) << e.what();
  }
  // The command: `timeout` ends it, should it serve after all.
  const std::string kNoToken =
      "env -u TPCOMM_STORE_TOKEN -u TPCOMM_STORE_TOKEN_FILE -u TPCOMM_STORE_REQUIRE_TOKEN ";
  const std::string store = std::string("timeout 5 ") + TPCOMM_CLI_PATH +
                            " store --bind 0.0.0.0 --port " + std::to_string(net::free_port()) +
                            " 2>&1";
  const auto plain = test::run_program(kNoToken + store);
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "--insecure")) << plain.output;
  const auto required =
      test::run_program(kNoToken + "TPCOMM_STORE_REQUIRE_TOKEN=1 " + store + " --insecure");
  EXPECT_NE(required.exit_code, 0) << required.output;
  EXPECT_TRUE(contains(required.output, "TPCOMM_STORE_REQUIRE_TOKEN=1")) << required.output;
}

// A tokenless store full of idle connections that said HELLO: rank 1 could not get in, and the
// job failed at its deadline. Connections that stand for no rank are displaced for it now.
TEST(StoreTrust, IdleConnectionsThatHoldNoRankCannotKeepARankOut) {
  constexpr int kMax = 8;
  TcpStoreServerConfig config = job(2);
  config.max_connections = kMax;
  TcpStoreServer server(config);
  auto s0 = watched(server.port(), 0, 5s);  // two connections
  std::vector<net::Socket> idle;
  for (int i = 0; i < kMax - 2; ++i) idle.push_back(raw_hello(server.port()));
  ASSERT_TRUE(eventually([&] { return server.connections() == kMax; }, 5s));
  const auto start = SteadyClock::now();
  std::shared_ptr<TcpStore> s1;
  try {
    s1 = watched(server.port(), 1, 3s);
  } catch (const Error& e) {
    ADD_FAILURE() << "rank 1 was kept out: " << e.what();
  }
  EXPECT_LT(SteadyClock::now() - start, 1s);
  EXPECT_GE(server.displaced_connections(), 2);
  ASSERT_NE(s1, nullptr);
  s1->set("k", "v");
  EXPECT_EQ(s0->get("k", 1s).size(), 1u);
}

// 600 ranks under a hard limit of 1024 open files all failed after 10 s, the store logging
// "accept: Too many open files" again and again. The store now serves what the limit holds and
// says so once: connections beyond it are refused as busy or displace idle ones, never left
// unanswered. (A hard limit of 320 files: 64 connections.)
TEST(StoreTrust, TheStoreServesWhatTheOpenFileLimitHolds) {
  constexpr int kConnections = 400;
  rlimit own{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_cur < kConnections + 64) {
    rlimit raised = own;
    raised.rlim_cur = std::min<rlim_t>(own.rlim_max, kConnections + 256);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &raised), 0);
    if (raised.rlim_cur < kConnections + 64) GTEST_SKIP() << "too few open files here";
  }
  const int port = net::free_port();
  const std::string port_text = std::to_string(port);
  char log_path[] = "/tmp/tpcomm-store-log-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  ASSERT_GE(log_fd, 0);
  const pid_t host = testing::fork_child([&] {
    const rlimit low{320, 320};
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) throw std::runtime_error("setrlimit");
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(log_fd, 2);
    ::execl(TPCOMM_CLI_PATH, TPCOMM_CLI_PATH, "store", "--port", port_text.c_str(), "--world-size",
            "2", static_cast<char*>(nullptr));
    throw std::runtime_error("cannot run " TPCOMM_CLI_PATH);
  });
  ::close(log_fd);
  std::vector<net::Socket> clients;
  int answered = 0;
  for (int i = 0; i < kConnections; ++i) {
    try {
      net::Socket s = net::connect_tcp("127.0.0.1", port, deadline_after(5s));
      const auto r = testing::raw_request(s.get(), {.opcode = wire::Opcode::kHello});
      if (r.header.code == ReplyCode::kOk || r.header.code == ReplyCode::kBusy) ++answered;
      clients.push_back(std::move(s));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "connection " << i << " got no answer: " << e.what();
      break;
    }
  }
  EXPECT_EQ(answered, kConnections);
  clients.clear();
  ::kill(host, SIGTERM);
  EXPECT_EQ(testing::wait_child(host, 5s), 0);
  std::ifstream in(log_path);
  std::stringstream log;
  log << in.rdbuf();
  ::unlink(log_path);
  const std::string text = log.str();
  EXPECT_TRUE(contains(text, "holds 64 connections")) << text;
  EXPECT_EQ(text.find("holds 64 connections"), text.rfind("holds 64 connections")) << text;
  EXPECT_FALSE(contains(text, "Too many open files")) << text;
}

// A world-1 job's store refused a 60,000-byte key with a 60,114-character message. Messages
// quote at most the first 256 bytes of a key, as the TCP store caps its reasons at 1 KiB.
TEST(StoreTrust, MessagesQuoteLongKeysShortened) {
  const std::string key(60000, 'k');
  LaunchInfo info;  // world size 1
  Bootstrap b = Bootstrap::from_launch_info(info, Options{});
  TcpStoreServer server(TcpStoreServerConfig{});
  TcpStore::Config c;
  c.port = server.port();
  TcpStore tcp(c);
  for (Store* store : {&b.store(), static_cast<Store*>(&tcp)}) {
    try {
      store->set(key, "v");
      ADD_FAILURE() << "a key of 60000 bytes was stored";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_LE(std::string(e.what()).size(), wire::kMaxReasonBytes) << e.what();
      EXPECT_TRUE(contains(e.what(), "(60000 bytes)")) << e.what();
    }
  }
}

}  // namespace
}  // namespace tpcomm
