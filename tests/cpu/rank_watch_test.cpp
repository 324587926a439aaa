// SPDX-License-Identifier: Apache-2.0
// A rank whose process is gone is noticed in milliseconds (NOTE [rank watch]).
#include "bootstrap/rank_watch.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/wire.hpp"
#include "support/child.hpp"
#include "support/raw_store.hpp"
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
using testing::fork_child;
using testing::raw_leave;
using testing::raw_watch;
using testing::wait_child;

// The goal: a survivor learns of a dead rank within this long.
constexpr milliseconds kNoticeWithin{1000};

using testing::Heard;
using testing::job;
using testing::watched;

milliseconds since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t);
}

// A child process that joins as a watched rank, says so, and then waits to be killed.
pid_t watched_child(int port, int rank) {
  return fork_child([port, rank] {
    net::Socket w = raw_watch(port, rank);
    TcpStore::Config c;
    c.port = port;
    TcpStore(std::move(c)).set("child/" + std::to_string(rank), "here");
    std::this_thread::sleep_for(60s);
  });
}

TEST(RankWatch, AKilledRankFailsEveryWaitAndIsReportedWithinMilliseconds) {
  TcpStoreServer server(job(3));
  auto s0 = watched(server.port(), 0);
  auto s1 = watched(server.port(), 1);
  ASSERT_NE(s0->rank_watch(), nullptr);
  Heard heard;
  const auto id = s0->rank_watch()->subscribe(heard.callback());
  Bootstrap b0(s0, 0, 3, 0, 3);
  const pid_t child = watched_child(server.port(), 2);
  s0->wait(std::vector<std::string>{"child/2"}, 10s);
  // Rank 1 waits in a barrier that rank 2 will never reach, with 30 s of deadline left.
  std::optional<Error> barrier_error;
  milliseconds barrier_took{};
  std::thread waiter([&] {
    Bootstrap b1(s1, 1, 3, 1, 3);
    const auto start = SteadyClock::now();
    try {
      b1.barrier();
    } catch (const Error& e) {
      barrier_error = e;
    }
    barrier_took = since(start);
  });
  ASSERT_TRUE(eventually([&] { return server.waiting() >= 1; }, 5s));
  const auto killed = SteadyClock::now();
  ::kill(child, SIGKILL);
  ASSERT_TRUE(heard.wait(5s));
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(heard.at - killed), kNoticeWithin);
  EXPECT_EQ(heard.lost->rank, 2);
  EXPECT_EQ(heard.lost->reason, "rank 2 left: its connection to the store closed");
  waiter.join();
  ASSERT_TRUE(barrier_error.has_value());
  EXPECT_EQ(barrier_error->status(), Status::kAborted) << barrier_error->what();
  EXPECT_NE(std::string(barrier_error->what()).find("rank 2 left"), std::string::npos)
      << barrier_error->what();
  EXPECT_LT(barrier_took, 30s - kNoticeWithin) << "the barrier ran to its deadline";
  // Later waits fail at once; what is there can still be read.
  const auto start = SteadyClock::now();
  try {
    b0.barrier();
    ADD_FAILURE() << "a barrier with a dead rank returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kAborted) << e.what();
  }
  EXPECT_LT(since(start), kNoticeWithin);
  EXPECT_EQ(s1->get("child/2").size(), 4u);
  // A subscriber that comes late hears it at once; an unsubscribed one no more.
  ASSERT_TRUE(eventually([&] { return s1->rank_watch()->lost().has_value(); }, 5s));
  Heard late;
  s1->rank_watch()->unsubscribe(s1->rank_watch()->subscribe(late.callback()));
  EXPECT_TRUE(late.lost.has_value());
  s0->rank_watch()->unsubscribe(id);
  EXPECT_EQ(wait_child(child, 5s), 128 + SIGKILL);
}

TEST(RankWatch, ARankThatDiesDuringSetupFailsTheOthersSetupAtOnce) {
  const int port = net::free_port();
  // Rank 2 connects as `from_launch_info` does, then dies before the host-name all-gather; a
  // moment after connecting, so that ranks 0 and 1 are in the store by then even on a loaded
  // machine (a rank that comes after rank 0 has failed and closed the store meets no server).
  const pid_t child = fork_child([port] {
    net::Socket w = raw_watch(port, 2);
    std::this_thread::sleep_for(1s);
    ::_exit(3);  // no goodbye
  });
  std::vector<std::optional<Error>> errors(2);
  std::vector<milliseconds> took(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      LaunchInfo info;
      info.rank = r;
      info.world_size = 3;
      info.store_port = port;
      Options o;  // the 30 s default deadline
      const auto start = SteadyClock::now();
      try {
        Bootstrap b = Bootstrap::from_launch_info(info, o);
        b.barrier();
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = e;
      }
      took[static_cast<std::size_t>(r)] = since(start);
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(wait_child(child, 5s), 3);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const auto& e = errors[static_cast<std::size_t>(r)];
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->status(), Status::kAborted) << e->what();
    EXPECT_NE(std::string(e->what()).find("rank 2 left"), std::string::npos) << e->what();
    EXPECT_LT(took[static_cast<std::size_t>(r)], 10s);
  }
}

TEST(RankWatch, RanksThatLeaveNormallyAreNotLost) {
  TcpStoreServer server(job(3));
  auto s0 = watched(server.port(), 0);
  Heard heard;
  const auto id = s0->rank_watch()->subscribe(heard.callback());
  // In this process: the destructor leaves.
  watched(server.port(), 1).reset();
  // In a child process that says goodbye.
  const pid_t child = fork_child([port = server.port()] {
    net::Socket w = raw_watch(port, 2);
    raw_leave(w);
  });
  EXPECT_EQ(wait_child(child, 10s), 0);
  EXPECT_FALSE(heard.wait(300ms)) << heard.lost->reason;
  try {
    s0->get("never-set", 200ms);
    ADD_FAILURE() << "get of a key never set returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout) << e.what();
  }
  // Nor is the server stopping a lost host.
  server.stop();
  EXPECT_FALSE(heard.wait(300ms)) << heard.lost->reason;
  s0->rank_watch()->unsubscribe(id);
}

TEST(RankWatch, ALostStoreHostIsReportedToItsClients) {
  const int port = net::free_port();
  const std::string port_text = std::to_string(port);
  const pid_t host = fork_child([&port_text] {
    ::execl(TPCOMM_CLI_PATH, TPCOMM_CLI_PATH, "store", "--bind", "127.0.0.1", "--port",
            port_text.c_str(), "--world-size", "2", static_cast<char*>(nullptr));
    throw std::runtime_error("cannot run " TPCOMM_CLI_PATH);
  });
  auto s1 = watched(port, 1, 10s);
  Heard heard;
  const auto id = s1->rank_watch()->subscribe(heard.callback());
  const auto killed = SteadyClock::now();
  ::kill(host, SIGKILL);
  ASSERT_TRUE(heard.wait(5s));
  EXPECT_LT(std::chrono::duration_cast<milliseconds>(heard.at - killed), kNoticeWithin);
  EXPECT_EQ(heard.lost->rank, -1);
  EXPECT_NE(heard.lost->reason.find("its host (rank 0"), std::string::npos) << heard.lost->reason;
  s1->rank_watch()->unsubscribe(id);
  EXPECT_EQ(wait_child(host, 5s), 128 + SIGKILL);
}

TEST(RankWatch, UnwatchedClientsHaveNoWatch) {
  TcpStoreServer server(TcpStoreServerConfig{});
  TcpStore::Config c;
  c.port = server.port();
  TcpStore s(std::move(c));
  EXPECT_EQ(s.rank_watch(), nullptr);
  EXPECT_EQ(InProcessStore().rank_watch(), nullptr);
}

TEST(RankWatch, TheKnobTurnsItOff) {
  auto lookup = [](const char* value) {
    return [value](const char* name) -> std::optional<std::string> {
      if (std::string_view(name) == "TPCOMM_RANK_WATCH") return value;
      return std::nullopt;
    };
  };
  EXPECT_TRUE(Options{}.rank_watch);
  EXPECT_FALSE(Options::from_lookup(lookup("0")).rank_watch);
  EXPECT_TRUE(Options::from_lookup(lookup("1")).rank_watch);
  try {
    (void)Options::from_lookup(lookup("maybe"));
    ADD_FAILURE() << "TPCOMM_RANK_WATCH=maybe was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TPCOMM_RANK_WATCH"), std::string::npos) << e.what();
  }
}

// One watch per rank of the job: a second watch of a rank, or one past the world size, is
// refused, and closing it loses nothing; once the rank left, it cannot watch again.
TEST(RankWatch, OneWatchPerRankOfTheJob) {
  TcpStoreServer server(job(2));
  auto s0 = watched(server.port(), 0);
  Heard heard;
  const auto id = s0->rank_watch()->subscribe(heard.callback());
  const auto rejected = server.rejected_frames();
  {
    net::Socket second = raw_watch(server.port(), 1);
    EXPECT_THROW(raw_watch(server.port(), 1), std::runtime_error);
    EXPECT_THROW(raw_watch(server.port(), 2), std::runtime_error);
    EXPECT_THROW(raw_watch(server.port(), 0), std::runtime_error);
    EXPECT_GE(server.rejected_frames(), rejected + 3);
    raw_leave(second);
  }
  EXPECT_FALSE(heard.wait(300ms)) << heard.lost->reason;
  s0->set("still", "here");
  const Bytes value = s0->get("still", 1s);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(value.data()), value.size()), "here");
  // Rank 1 left normally: its place is gone, and a watch of it is refused, losing nothing.
  ASSERT_TRUE(eventually([&] { return server.connections() == 2; }, 5s));
  try {
    raw_watch(server.port(), 1);
    ADD_FAILURE() << "rank 1 watched again after it left";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 left the job"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(heard.wait(300ms)) << heard.lost->reason;
  s0->rank_watch()->unsubscribe(id);
}

// A server at its connection limit answers a watch claim "busy": the claim is retried until a
// connection frees up, within the client's timeout.
TEST(RankWatch, ABusyWatchClaimIsRetried) {
  TcpStoreServerConfig config = job(2);
  config.max_connections = 3;
  TcpStoreServer server(config);
  auto s0 = watched(server.port(), 0);  // two connections
  std::atomic<bool> ready{false};
  std::shared_ptr<TcpStore> s1;
  std::thread late([&] {
    s1 = watched(server.port(), 1, 10s);  // its watch is the fourth connection
    ready.store(true);
  });
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(ready.load());  // refused as busy, and trying again
  s0.reset();                  // frees two
  late.join();
  ASSERT_NE(s1, nullptr);
  EXPECT_NE(s1->rank_watch(), nullptr);
}

// The default limit holds 1024 ranks of two connections each: the server raises the process's
// soft limit of open files to fit, as far as the hard limit allows.
TEST(RankWatch, TheServerFitsTheOpenFileLimitToItsConnections) {
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  TcpStoreServer server(TcpStoreServerConfig{});
  rlimit after{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  const rlim_t want = 2 * 1024 + 64;
  if (before.rlim_max == RLIM_INFINITY || before.rlim_max >= want + 256) {
    EXPECT_GE(after.rlim_cur, want) << "hard limit " << before.rlim_max;
  } else {
    EXPECT_EQ(after.rlim_cur, before.rlim_max);
  }
}

TEST(RankWatch, WatchFramesAreChecked) {
  wire::RequestHeader h{
      .opcode = wire::Opcode::kWatch, .value_len = wire::kWatchSecretBytes, .arg = 3};
  EXPECT_FALSE(wire::check_request(h, {}));
  h.value_len = 0;  // a watch of a rank carries its secret
  EXPECT_TRUE(wire::check_request(h, {}));
  h.arg = -1;
  EXPECT_FALSE(wire::check_request(h, {}));
  h.value_len = wire::kWatchSecretBytes;  // leaving carries none
  EXPECT_TRUE(wire::check_request(h, {}));
  h.value_len = 0;
  h.arg = -2;
  EXPECT_TRUE(wire::check_request(h, {}));
  h.arg = std::int64_t{1} << 40;
  EXPECT_TRUE(wire::check_request(h, {}));
  h.arg = 0;
  h.key_len = 3;
  EXPECT_TRUE(wire::check_request(h, {}));
  wire::RequestHeader claim{.opcode = wire::Opcode::kClaim, .arg = 2};
  EXPECT_FALSE(wire::check_request(claim, {}));
  claim.arg = -1;
  EXPECT_TRUE(wire::check_request(claim, {}));
  claim.arg = 2;
  claim.value_len = 1;
  EXPECT_TRUE(wire::check_request(claim, {}));
}

}  // namespace
}  // namespace tpcomm
