// SPDX-License-Identifier: Apache-2.0
#include "tpcomm/bootstrap.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "bootstrap/agree.hpp"
#include "bootstrap/socket.hpp"
#include "core/log.hpp"
#include "support/child.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

using namespace std::chrono_literals;

Bytes bytes(std::string_view s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// Rank r's all-gather contribution: r + 1 bytes, each (r * 16 + i), so lengths differ per rank
// and a misplaced part names its origin.
Bytes part_of(int r) {
  Bytes b(static_cast<std::size_t>(r + 1));
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<std::byte>(r * 16 + static_cast<int>(i));
  return b;
}

// Runs `body(bootstrap)` on one thread per bootstrap; rethrows nothing, records failures.
void run_ranks(std::vector<Bootstrap>& boots, const std::function<void(Bootstrap&)>& body) {
  std::vector<std::thread> threads;
  for (auto& b : boots) {
    threads.emplace_back([&body, &b] {
      try {
        body(b);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << b.rank() << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Bootstrap, InProcessIdentity) {
  auto boots = Bootstrap::in_process(4, 2s);
  ASSERT_EQ(boots.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const Bootstrap& b = boots[static_cast<std::size_t>(r)];
    EXPECT_EQ(b.rank(), r);
    EXPECT_EQ(b.world_size(), 4);
    EXPECT_EQ(b.local_rank(), r);
    EXPECT_EQ(b.local_world_size(), 4);
    EXPECT_EQ(b.node_id(), 0);
    EXPECT_EQ(b.timeout(), 2s);
    EXPECT_EQ(b.shared_store(), boots[0].shared_store());
  }
}

TEST(Bootstrap, CollectivesAcrossEightThreads) {
  constexpr int kRanks = 8;
  constexpr int kRounds = 20;
  auto boots = Bootstrap::in_process(kRanks, 10s);
  run_ranks(boots, [](Bootstrap& b) {
    for (int round = 0; round < kRounds; ++round) {
      b.barrier();
      auto parts = b.all_gather(part_of(b.rank()));
      ASSERT_EQ(parts.size(), std::size_t{kRanks});
      for (int r = 0; r < kRanks; ++r) ASSERT_EQ(parts[static_cast<std::size_t>(r)], part_of(r));
      const int root = round % kRanks;
      Bytes mine = bytes("round " + std::to_string(round) + " from " + std::to_string(b.rank()));
      Bytes got = b.broadcast(mine, root);
      ASSERT_EQ(got, bytes("round " + std::to_string(round) + " from " + std::to_string(root)));
      auto values = b.all_gather_value(b.rank() * 1000 + round);
      for (int r = 0; r < kRanks; ++r)
        ASSERT_EQ(values[static_cast<std::size_t>(r)], r * 1000 + round);
      ASSERT_EQ(b.broadcast_value(round * 7 + b.rank(), kRanks - 1), round * 7 + kRanks - 1);
    }
  });
  // NOTE [bootstrap keys]: keys of finished collectives are erased along the way.
  Store& store = boots[0].store();
  for (int r = 0; r < kRanks; ++r) {
    const std::string first_barrier = "tpcomm/1/barrier/" + std::to_string(r);
    const std::string early_gather = "tpcomm/2/all_gather/" + std::to_string(r);
    EXPECT_FALSE(store.check(std::span(&first_barrier, 1))) << first_barrier;
    EXPECT_FALSE(store.check(std::span(&early_gather, 1))) << early_gather;
  }
}

TEST(Bootstrap, AgreeNamesTheLowestFailingRankOnEveryRank) {
  auto boots = Bootstrap::in_process(4, 10s);
  run_ranks(boots, [](Bootstrap& b) {
    EXPECT_EQ(agree(b, ""), "");
    const std::string mine = b.rank() >= 2 ? "no memory on " + std::to_string(b.rank()) : "";
    EXPECT_EQ(agree(b, mine), "rank 2: no memory on 2");
    EXPECT_EQ(agree(b, b.rank() == 3 ? "late" : ""), "rank 3: late");
  });
}

TEST(Bootstrap, DisagreementsNameTheSettingAndTheRanksWithEachValue) {
  auto boots = Bootstrap::in_process(4, 10s);
  run_ranks(boots, [](Bootstrap& b) {
    const std::string same = "8M";
    const std::string algo = b.rank() == 2 ? "one_shot" : "auto";
    const std::string bytes = std::to_string(b.rank() % 2 == 0 ? 512 : 1024);
    const Setting alike[] = {{"A", same}, {"B", "x"}};
    EXPECT_EQ(disagreements(b, alike), "");
    const Setting differ[] = {{"TPCOMM_CUSTOM_AR_MAX_BYTES", same},
                              {"TPCOMM_ALGO", algo},
                              {"TPCOMM_LAMPORT_MAX_BYTES", bytes}};
    EXPECT_EQ(disagreements(b, differ),
              "TPCOMM_ALGO: auto on ranks 0, 1, 3; one_shot on rank 2\n"
              "TPCOMM_LAMPORT_MAX_BYTES: 512 on ranks 0, 2; 1024 on ranks 1, 3");
  });
}

/// Ranks 0 and 1 of 3 (built with `timeout`) call `barrier` without rank 2: each must fail with
/// kTimeout within `within`, the message holding every one of `says`.
void expect_barrier_without_rank_2(Milliseconds timeout,
                                   const std::function<void(Bootstrap&)>& barrier,
                                   std::chrono::seconds within,
                                   std::initializer_list<const char*> says) {
  auto boots = Bootstrap::in_process(3, timeout);
  std::vector<Bootstrap> present;
  present.push_back(std::move(boots[0]));
  present.push_back(std::move(boots[1]));
  std::atomic<int> timeouts{0};
  run_ranks(present, [&](Bootstrap& b) {
    auto t0 = std::chrono::steady_clock::now();
    try {
      barrier(b);
      ADD_FAILURE() << "barrier returned without rank 2";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kTimeout);
      for (const char* s : says)
        EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
      timeouts.fetch_add(1);
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, within);
  });
  EXPECT_EQ(timeouts.load(), 2);
}

TEST(Bootstrap, BarrierTimeoutNamesTheMissingRank) {
  expect_barrier_without_rank_2(300ms, [](Bootstrap& b) { b.barrier(); }, 2s,
                                {"rank 2 did not arrive"});
}

// A group bounds its own waits on the bootstrap (a new stream's warm-up) by its deadline, which
// may be far shorter than the bootstrap's.
TEST(Bootstrap, BarrierWithItsOwnTimeoutWaitsNoLonger) {
  expect_barrier_without_rank_2(60s, [](Bootstrap& b) { b.barrier(300ms); }, 5s,
                                {"timed out after 300 ms", "rank 2 did not arrive"});
}

TEST(Bootstrap, BroadcastTimeoutNamesTheRoot) {
  auto boots = Bootstrap::in_process(2, 200ms);
  try {
    boots[1].broadcast({}, 0);
    FAIL() << "broadcast returned without its root";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout);
    EXPECT_NE(std::string(e.what()).find("rank 0 did not arrive"), std::string::npos) << e.what();
  }
  EXPECT_THROW(boots[1].broadcast({}, 2), Error);
}

TEST(Bootstrap, SplitGroupsRunIndependently) {
  auto boots = Bootstrap::in_process(4, 10s);
  run_ranks(boots, [](Bootstrap& b) {
    const int evens[] = {0, 2};
    const int odds[] = {1, 3};
    const bool even = b.rank() % 2 == 0;
    Bootstrap sub =
        b.split(even ? std::span<const int>(evens) : std::span<const int>(odds), "pair");
    EXPECT_EQ(sub.world_size(), 2);
    EXPECT_EQ(sub.rank(), b.rank() / 2);
    EXPECT_EQ(sub.local_rank(), b.rank() / 2);
    EXPECT_EQ(sub.local_world_size(), 2);
    EXPECT_EQ(sub.node_id(), 0);
    EXPECT_EQ(sub.prefix(), even ? "tpcomm/pair/0,2" : "tpcomm/pair/1,3");
    // The groups run different numbers of collectives without disturbing each other.
    const int rounds = even ? 5 : 2;
    for (int i = 0; i < rounds; ++i) {
      auto ranks = sub.all_gather_value(b.rank());
      ASSERT_EQ(ranks.size(), 2u);
      EXPECT_EQ(ranks[0], even ? 0 : 1);
      EXPECT_EQ(ranks[1], even ? 2 : 3);
      sub.barrier();
    }
    // The parent still works, after and alongside its sub-groups.
    auto all = b.all_gather_value(b.rank() * 10);
    EXPECT_EQ(all, (std::vector<int>{0, 10, 20, 30}));
  });
}

TEST(Bootstrap, SplitValidatesItsRanks) {
  auto boots = Bootstrap::in_process(4, 1s);
  Bootstrap& b = boots[1];
  auto expect_invalid = [&](std::vector<int> ranks, std::string_view tag, std::string_view needle) {
    try {
      (void)b.split(ranks, tag);
      ADD_FAILURE() << "split accepted " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_invalid({}, "t", "empty");
  expect_invalid({1, 0}, "t", "ascending");
  expect_invalid({1, 1}, "t", "ascending");
  expect_invalid({0, 4}, "t", "out of range");
  expect_invalid({0, 2}, "t", "not in the sub-group");
  expect_invalid({0, 1}, "", "tag");
  expect_invalid({0, 1}, "a/b", "tag");
  EXPECT_EQ(b.split(std::vector<int>{1}, "solo").world_size(), 1);
}

TEST(Bootstrap, DerivesLocalityFromHostNames) {
  auto store = std::make_shared<InProcessStore>();
  store->set_default_timeout(5s);
  std::vector<std::thread> threads;
  std::vector<std::optional<Bootstrap>> boots(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { boots[static_cast<std::size_t>(r)].emplace(store, r, 3); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    // One machine: everyone shares node 0.
    EXPECT_EQ(boots[static_cast<std::size_t>(r)]->local_rank(), r);
    EXPECT_EQ(boots[static_cast<std::size_t>(r)]->local_world_size(), 3);
    EXPECT_EQ(boots[static_cast<std::size_t>(r)]->node_id(), 0);
  }
}

TEST(Bootstrap, SingleProcessNeedsNoSockets) {
  LaunchInfo info;  // world size 1, "single"
  Options options;
  options.timeout_ms = 1000;
  Bootstrap b = Bootstrap::from_launch_info(info, options);
  EXPECT_EQ(b.world_size(), 1);
  EXPECT_NE(dynamic_cast<InProcessStore*>(&b.store()), nullptr);
  b.barrier();
  EXPECT_EQ(b.broadcast(bytes("x"), 0), bytes("x"));
  EXPECT_EQ(b.all_gather(bytes("y")), std::vector<Bytes>{bytes("y")});
}

TEST(Bootstrap, ThreeProcessesOverTcp) {
  constexpr int kRanks = 3;
  const int port = net::free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    pids.push_back(testing::fork_child([r, port] {
      LaunchInfo info;
      info.rank = r;
      info.world_size = kRanks;
      info.store_host = "127.0.0.1";
      info.store_port = port;
      info.source = "explicit";
      Options options;
      options.timeout_ms = 10000;
      options.store_token = "job-token";
      Bootstrap b = Bootstrap::from_launch_info(info, options);
      auto check = [](bool ok, const std::string& what) {
        if (!ok) throw std::runtime_error(what);
      };
      check(b.rank() == r && b.world_size() == kRanks, "identity");
      check(b.node_id() == 0 && b.local_rank() == r && b.local_world_size() == kRanks, "locality");
      check(dynamic_cast<TcpStore*>(&b.store()) != nullptr, "a TCP store");
      for (int round = 0; round < 5; ++round) {
        b.barrier();
        auto parts = b.all_gather(part_of(r));
        for (int q = 0; q < kRanks; ++q)
          check(parts[static_cast<std::size_t>(q)] == part_of(q), "all_gather");
        const int root = round % kRanks;
        check(b.broadcast_value(r * 100 + round, root) == root * 100 + round, "broadcast");
      }
      b.barrier();
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(testing::wait_child(pid, 30s), 0);
}

// The launcher's largest world, 1024 ranks as processes, starts on one store (two connections
// a rank: requests and the rank watch), meets at barriers and hears rank 0's broadcast.
TEST(Bootstrap, TheLaunchersLargestWorldStartsOnOneStore) {
  constexpr int kRanks = 1024;
  const int port = net::free_port();
  std::vector<pid_t> pids;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kRanks; ++r) {
    pids.push_back(testing::fork_child([r, port] {
      LaunchInfo info;
      info.rank = r;
      info.world_size = kRanks;
      info.local_rank = r;
      info.local_world_size = kRanks;
      info.store_host = "127.0.0.1";
      info.store_port = port;
      info.source = "explicit";
      Options options;
      options.timeout_ms = 120000;
      options.store_token = "job-token";
      Bootstrap b = Bootstrap::from_launch_info(info, options);
      b.barrier();
      if (b.broadcast_value(r == 0 ? 4242 : r, 0) != 4242) throw std::runtime_error("broadcast");
      b.barrier();
    }));
  }
  int failed = 0;
  for (pid_t pid : pids) failed += testing::wait_child(pid, 300s) == 0 ? 0 : 1;
  EXPECT_EQ(failed, 0);
  std::printf("%d ranks started, met and finished in %.1f s\n", kRanks,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// A store address from TPCOMM_STORE_BIND that does not resolve names the variable.
TEST(Bootstrap, UnresolvableStoreBindNamesTheVariable) {
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.source = "explicit";
  Options options;
  options.timeout_ms = 1000;
  options.store_bind = "garbage";
  try {
    Bootstrap::from_launch_info(info, options);
    FAIL() << "bound to \"garbage\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("TPCOMM_STORE_BIND=\"garbage\""), std::string::npos) << what;
    EXPECT_NE(what.find("cannot resolve host"), std::string::npos) << what;
  }
}

// Rank 0 hosts the store; when its port is taken (under torchrun, by the agent's own store)
// the error says so and names the knob that moves it.
TEST(Bootstrap, TakenStorePortIsAClearError) {
  net::Socket holder = net::listen_tcp("127.0.0.1", 0, 1);
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.store_port = net::local_port(holder.get());
  info.source = "explicit";
  Options options;
  options.timeout_ms = 1000;
  try {
    Bootstrap::from_launch_info(info, options);
    FAIL() << "hosting the store on a taken port succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kSystemError);
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 0 cannot host the store"), std::string::npos) << what;
    EXPECT_NE(what.find("TPCOMM_STORE_ADDR"), std::string::npos) << what;
  }
}

TEST(Bootstrap, WrongTokenCannotJoin) {
  const int port = net::free_port();
  auto rank_with = [port](int r, std::string token) {
    return testing::fork_child([=] {
      LaunchInfo info;
      info.rank = r;
      info.world_size = 2;
      info.store_port = port;
      info.source = "explicit";
      Options options;
      options.timeout_ms = 1500;
      options.store_token = token;
      try {
        Bootstrap b = Bootstrap::from_launch_info(info, options);
        b.barrier();
      } catch (const Error& e) {
        // Rank 1 is refused at connect; rank 0 then times out waiting for it.
        const bool expected =
            r == 1 ? e.status() == Status::kInvalidArgument : e.status() == Status::kTimeout;
        if (expected) ::_exit(3);
        throw;
      }
    });
  };
  pid_t host = rank_with(0, "right");
  pid_t intruder = rank_with(1, "wrong");
  EXPECT_EQ(testing::wait_child(intruder, 20s), 3);
  EXPECT_EQ(testing::wait_child(host, 20s), 3);
}

// Rank 0 of a job whose peers never come, hosting the store on `bind` with `token`; returns
// what it logged.
std::string log_of_rank0_hosting(const std::string& bind, const std::string& token) {
  LaunchInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.source = "explicit";
  Options options;
  options.timeout_ms = 200;
  options.store_bind = bind;
  options.store_token = token;
  ::testing::internal::CaptureStderr();
  try {
    Bootstrap::from_launch_info(info, options);
  } catch (const Error& e) {
    if (e.status() != Status::kTimeout) throw;
  }
  return ::testing::internal::GetCapturedStderr();
}

std::size_t count(const std::string& text, std::string_view needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A store open to the network without a token says so at the default log level, once, with
// what it risks and how to set a token.
TEST(Bootstrap, AStoreOpenToTheNetworkWithoutATokenWarnsOnce) {
  pid_t open = testing::fork_child([] {
    log::set_level(LogLevel::kWarn);
    const std::string first = log_of_rank0_hosting("0.0.0.0", "");
    const std::string again = log_of_rank0_hosting("0.0.0.0", "");
    for (std::string_view needle : {"without a token", "peer-memory handles",
                                    "TPCOMM_STORE_TOKEN=", "TPCOMM_STORE_TOKEN_FILE="}) {
      if (first.find(needle) == std::string::npos)
        throw std::runtime_error("no \"" + std::string(needle) + "\" in: " + first);
    }
    if (count(first + again, "without a token") != 1)
      throw std::runtime_error("warned more than once: " + first + again);
  });
  EXPECT_EQ(testing::wait_child(open, 20s), 0);
  pid_t closed = testing::fork_child([] {
    log::set_level(LogLevel::kWarn);
    const std::string logged =
        log_of_rank0_hosting("0.0.0.0", "secret") + log_of_rank0_hosting("127.0.0.1", "");
    if (logged.find("without a token") != std::string::npos)
      throw std::runtime_error("warned for a store with a token or on loopback: " + logged);
  });
  EXPECT_EQ(testing::wait_child(closed, 20s), 0);
}

TEST(Bootstrap, TypedHelpersCheckSizes) {
  auto boots = Bootstrap::in_process(2, 5s);
  run_ranks(boots, [](Bootstrap& b) {
    // Ranks disagreeing on the type is a clear error, not a silent misread.
    if (b.rank() == 0) {
      EXPECT_THROW(b.all_gather_value(std::int32_t{1}), Error);
    } else {
      EXPECT_THROW(b.all_gather_value(std::int64_t{1}), Error);
    }
  });
}

}  // namespace
}  // namespace tpcomm
