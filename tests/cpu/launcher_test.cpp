// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/launcher.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "support/child.hpp"
#include "support/run_program.hpp"
#include "tpcomm/status.hpp"

#ifndef TPCOMM_FAKE_RANK
#error "TPCOMM_FAKE_RANK must name the fake_rank helper"
#endif
#ifndef TPCOMM_CLI_PATH
#error "TPCOMM_CLI_PATH must name the tpcomm program"
#endif

namespace tpcomm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Launcher : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tpcomm-launcher-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A launch of `n` fake ranks; argument i is rank i's steps (the last one for the rest).
  static LaunchSpec spec(int n, std::vector<std::string> steps) {
    LaunchSpec s;
    s.argv = {TPCOMM_FAKE_RANK};
    s.argv.insert(s.argv.end(), steps.begin(), steps.end());
    s.nprocs = n;
    s.grace = 500ms;
    return s;
  }

  [[nodiscard]] std::string path(const std::string& name) const { return dir_ + "/" + name; }

  [[nodiscard]] std::map<std::string, std::string> env_of(int rank) const {
    std::map<std::string, std::string> out;
    std::ifstream in(path("env." + std::to_string(rank)));
    std::string line;
    while (std::getline(in, line)) {
      auto eq = line.find('=');
      out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return out;
  }

  // No process of the launch may outlive it.
  static void expect_all_gone(const LaunchResult& r) {
    for (const RankExit& e : r.ranks) {
      ASSERT_GT(e.pid, 0);
      errno = 0;
      EXPECT_EQ(::kill(e.pid, 0), -1) << "rank " << e.rank << " (pid " << e.pid << ") survived";
      EXPECT_EQ(errno, ESRCH);
      EXPECT_NE(e.how, RankExit::How::kRunning);
    }
  }

  // The pid a shell rank wrote to `name`; 0 until the file holds one.
  [[nodiscard]] pid_t pid_in(const std::string& name) const {
    std::ifstream in(path(name));
    long pid = 0;
    in >> pid;
    return static_cast<pid_t>(pid);
  }

  // True when `pid` has ended: no such process, or a zombie nobody has reaped yet (an orphan
  // that init has not collected).
  static bool ended(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    if (!stat) return true;
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    return paren == std::string::npos || line.size() < paren + 3 || line[paren + 2] == 'Z' ||
           line[paren + 2] == 'X';
  }

  // A rank that starts `sleep SECONDS` in the background and writes its pid to bg.RANK.
  [[nodiscard]] std::string background_sleep(int seconds) const {
    return "sleep " + std::to_string(seconds) + " & echo $! > " + path("bg.") + "$RANK.tmp && mv " +
           path("bg.") + "$RANK.tmp " + path("bg.") + "$RANK; ";
  }

  std::string dir_;
};

TEST_F(Launcher, EveryRankSeesItsOwnNumbering) {
  ::setenv("TPCOMM_RANK", "5", 1);  // an explicit rank from outside must not leak into children
  LaunchSpec s = spec(4, {"env:" + path("env.")});
  s.env = {{"TPCOMM_TEST_EXTRA", "extra value"}};
  LaunchResult r = launch_local(s);
  ::unsetenv("TPCOMM_RANK");
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_TRUE(r.message.empty());
  ASSERT_EQ(r.ranks.size(), 4u);
  std::string port;
  std::string token;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    auto env = env_of(rank);
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["TPCOMM_RANK"], "<unset>");
    EXPECT_EQ(env["TPCOMM_TEST_EXTRA"], "extra value");
    const int p = std::atoi(env["MASTER_PORT"].c_str());
    EXPECT_GT(p, 0);
    EXPECT_LE(p, 65535);
    if (rank == 0) {
      port = env["MASTER_PORT"];
      token = env["TPCOMM_STORE_TOKEN"];
    }
    EXPECT_EQ(env["MASTER_PORT"], port);
    EXPECT_EQ(env["TPCOMM_STORE_TOKEN"], token);
    EXPECT_EQ(r.ranks[static_cast<std::size_t>(rank)].how, RankExit::How::kExited);
    EXPECT_EQ(r.ranks[static_cast<std::size_t>(rank)].code, 0);
  }
  EXPECT_GE(token.size(), 32u);
  expect_all_gone(r);
}

TEST_F(Launcher, KeepsAGivenToken) {
  LaunchSpec s = spec(2, {"env:" + path("env.")});
  s.env = {{"TPCOMM_STORE_TOKEN", "given"}};
  s.master_port = 12345;
  LaunchResult r = launch_local(s);
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(env_of(1)["TPCOMM_STORE_TOKEN"], "given");
  EXPECT_EQ(env_of(1)["MASTER_PORT"], "12345");
}

// A token file names the job's secret: no random token is added beside it (both set is an
// error for the ranks).
TEST_F(Launcher, KeepsAGivenTokenFile) {
  LaunchSpec s = spec(2, {"env:" + path("env.")});
  s.env = {{"TPCOMM_STORE_TOKEN_FILE", "/run/secrets/tpcomm-token"}};
  LaunchResult r = launch_local(s);
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_EQ(env_of(1)["TPCOMM_STORE_TOKEN_FILE"], "/run/secrets/tpcomm-token");
  EXPECT_EQ(env_of(1)["TPCOMM_STORE_TOKEN"], "<unset>");
}

// An empty token means "no authentication": inherited or given, it is replaced by a random one,
// the same for every rank.
TEST_F(Launcher, AnEmptyTokenIsReplacedByARandomOne) {
  for (bool inherited : {true, false}) {
    SCOPED_TRACE(inherited ? "inherited" : "given");
    LaunchSpec s = spec(2, {"env:" + path("env.")});
    if (inherited) {
      ::setenv("TPCOMM_STORE_TOKEN", "", 1);
    } else {
      s.env = {{"TPCOMM_STORE_TOKEN", ""}};
    }
    LaunchResult r = launch_local(s);
    ::unsetenv("TPCOMM_STORE_TOKEN");
    EXPECT_EQ(r.exit_code, 0) << r.message;
    const std::string token = env_of(0)["TPCOMM_STORE_TOKEN"];
    EXPECT_GE(token.size(), 32u) << token;
    EXPECT_EQ(env_of(1)["TPCOMM_STORE_TOKEN"], token);
  }
}

TEST_F(Launcher, OneFailingRankStopsTheOthers) {
  auto t0 = Clock::now();
  LaunchResult r = launch_local(spec(4, {"sleep:60", "sleep:60", "exit:3", "sleep:60"}));
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.message, "rank 2 exited with code 3");
  for (const RankExit& e : r.ranks) {
    if (e.rank == 2) continue;
    EXPECT_EQ(e.how, RankExit::How::kSignaled) << describe(e);
    EXPECT_EQ(e.signal, SIGTERM);
    EXPECT_TRUE(e.stopped_by_launcher);
  }
  expect_all_gone(r);
}

TEST_F(Launcher, ReportsARankKilledBySignal) {
  LaunchResult r = launch_local(spec(3, {"sleep:60", "signal:9", "sleep:60"}));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_EQ(r.message, "rank 1 killed by signal 9 (SIGKILL)");
  expect_all_gone(r);
}

// A rank killed by a signal, and a survivor that exits with an error moments later because it
// noticed: the summary names the killed rank, not the survivor.
TEST_F(Launcher, NamesTheKilledRankNotTheSurvivorThatNoticedIt) {
  // The survivor exits only once the launcher has reaped the killed rank: a survivor that
  // exited as soon as the other was about to die could end first on a loaded machine.
  LaunchResult r = launch_local(
      spec(2, {"await-gone:" + path("dead1") + ",exit:1", "pid:" + path("dead") + ",signal:9"}));
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.message;
  EXPECT_EQ(r.message, "rank 1 killed by signal 9 (SIGKILL)");
  expect_all_gone(r);
}

// A rank that exits with an error, and a survivor (the lower rank) that exits with another code
// moments later because it noticed: the summary names the rank that ended first (the watch loop
// wakes as each rank ends).
TEST_F(Launcher, NamesTheRankThatEndedFirstNotTheLowerOneThatNoticedIt) {
  // The survivor exits 12-17 ms after the other, within one 20 ms tick of a loop that read the
  // exits only at its ticks (and named the lower rank of those read together) in about a
  // quarter of the runs.
  for (int run = 0; run < 12; ++run) {
    SCOPED_TRACE(run);
    const std::string gone = path("gone" + std::to_string(run) + ".");
    LaunchResult r = launch_local(
        spec(2, {"await:" + gone + "1,sleep:0.012,exit:3", "touch:" + gone + ",exit:7"}));
    EXPECT_EQ(r.exit_code, 7) << r.message;
    EXPECT_EQ(r.message, "rank 1 exited with code 7");
    EXPECT_LT(r.ranks[1].ended_at, r.ranks[0].ended_at);
    expect_all_gone(r);
  }
}

TEST_F(Launcher, DeadlineStopsEveryRank) {
  LaunchSpec s = spec(3, {"sleep:60"});
  s.timeout = 300ms;
  auto t0 = Clock::now();
  LaunchResult r = launch_local(s);
  EXPECT_GE(Clock::now() - t0, 300ms);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_EQ(r.message, "deadline of 0.3 s passed; ranks 0, 1, 2 still running");
  expect_all_gone(r);
}

TEST_F(Launcher, RankIgnoringSigtermIsKilledAfterTheGrace) {
  // Rank 0 ignores SIGTERM before rank 1 fails, so only SIGKILL can stop it.
  LaunchSpec s = spec(2, {"ignore-term,touch:" + path("ready.") + ",sleep:60",
                          "await:" + path("ready.0") + ",exit:1"});
  auto t0 = Clock::now();
  LaunchResult r = launch_local(s);
  EXPECT_GE(Clock::now() - t0, s.grace);
  EXPECT_LT(Clock::now() - t0, 5s);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.message, "rank 1 exited with code 1");
  EXPECT_EQ(r.ranks[0].how, RankExit::How::kSignaled);
  EXPECT_EQ(r.ranks[0].signal, SIGKILL);
  expect_all_gone(r);
}

TEST_F(Launcher, SkippedRanksGive77) {
  LaunchResult all = launch_local(spec(3, {"exit:77"}));
  EXPECT_EQ(all.exit_code, 77);
  EXPECT_EQ(all.message, "every rank exited with code 77 (skipped)");
  LaunchResult mixed = launch_local(spec(3, {"exit:0", "exit:77", "exit:0"}));
  EXPECT_EQ(mixed.exit_code, 77);
  EXPECT_EQ(mixed.message, "rank 1 exited with code 77 (skipped)");
  // A real failure wins over a skip.
  LaunchResult failed = launch_local(spec(2, {"exit:77", "exit:5"}));
  EXPECT_EQ(failed.exit_code, 5);
}

TEST_F(Launcher, ForwardsSigintToEveryRank) {
  struct sigaction before {};
  ::sigaction(SIGINT, nullptr, &before);
  std::thread interrupter([&] {
    // Interrupt once both ranks are running; the launcher handles SIGINT until it returns.
    if (testing::eventually(
            [&] {
              struct stat st {};
              return ::stat(path("up.0").c_str(), &st) == 0 &&
                     ::stat(path("up.1").c_str(), &st) == 0;
            },
            10s)) {
      ::kill(::getpid(), SIGINT);
    }
  });
  LaunchResult r = launch_local(spec(2, {"touch:" + path("up.") + ",sleep:60"}));
  interrupter.join();
  EXPECT_EQ(r.exit_code, 128 + SIGINT);
  EXPECT_NE(r.message.find("SIGINT"), std::string::npos) << r.message;
  for (const RankExit& e : r.ranks) {
    EXPECT_EQ(e.how, RankExit::How::kSignaled);
    EXPECT_EQ(e.signal, SIGINT);
  }
  expect_all_gone(r);
  struct sigaction after {};
  ::sigaction(SIGINT, nullptr, &after);
  EXPECT_EQ(after.sa_handler, before.sa_handler);
}

// NOTE [rank process groups]: a rank's background children live in its process group, and the
// launcher signals that group when the job ends, whether the rank failed, succeeded or was
// stopped.
TEST_F(Launcher, BackgroundChildrenDoNotOutliveTheJob) {
  // Rank 0 leaves a child behind and fails once rank 1 has left one too; rank 1 is stopped.
  LaunchSpec failing;
  failing.argv = {"/bin/sh", "-c",
                  background_sleep(272) + "if [ $RANK = 0 ]; then while [ ! -e " + path("bg.1") +
                      " ]; do sleep 0.01; done; exit 1; fi; sleep 60"};
  failing.nprocs = 2;
  failing.grace = 500ms;
  const auto t0 = Clock::now();
  LaunchResult r = launch_local(failing);
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_EQ(r.exit_code, 1) << r.message;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t bg = pid_in("bg." + std::to_string(rank));
    ASSERT_GT(bg, 0) << rank;
    EXPECT_TRUE(testing::eventually([&] { return ended(bg); }, 2s))
        << "rank " << rank << "'s background child " << bg << " survived";
    ::kill(bg, SIGKILL);
  }
  expect_all_gone(r);

  // Ranks that succeed leave nothing running either.
  LaunchSpec succeeding;
  succeeding.argv = {"/bin/sh", "-c", background_sleep(271) + "exit 0"};
  succeeding.nprocs = 2;
  r = launch_local(succeeding);
  EXPECT_EQ(r.exit_code, 0) << r.message;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t bg = pid_in("bg." + std::to_string(rank));
    ASSERT_GT(bg, 0) << rank;
    EXPECT_TRUE(testing::eventually([&] { return ended(bg); }, 2s))
        << "rank " << rank << "'s background child " << bg << " survived";
    ::kill(bg, SIGKILL);
  }
}

// A SIGKILL of the launcher itself takes the ranks and their process groups with it.
TEST_F(Launcher, KillingTheLauncherStopsTheRanksChildren) {
  const std::string cli = tpcomm::test::built_file(TPCOMM_CLI_PATH);
  const std::string script = background_sleep(274) + "sleep 60";
  const pid_t launcher = testing::fork_child([&] {
    ::execl(cli.c_str(), cli.c_str(), "launch", "-n", "2", "--", "/bin/sh", "-c", script.c_str(),
            static_cast<char*>(nullptr));
    throw std::runtime_error("execl failed");
  });
  ASSERT_GT(launcher, 0);
  const bool started =
      testing::eventually([&] { return pid_in("bg.0") > 0 && pid_in("bg.1") > 0; }, 10s);
  ::kill(launcher, SIGKILL);
  EXPECT_EQ(testing::wait_child(launcher, 5s), 128 + SIGKILL);
  ASSERT_TRUE(started);
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t bg = pid_in("bg." + std::to_string(rank));
    EXPECT_TRUE(testing::eventually([&] { return ended(bg); }, 3s))
        << "rank " << rank << "'s background child " << bg << " survived the launcher";
    ::kill(bg, SIGKILL);
  }
}

TEST_F(Launcher, RefusesMoreRanksThanTheLimit) {
  // Refused before anything else is looked at, the program included.
  LaunchSpec many;
  many.argv = {path("")};
  many.nprocs = 100000;
  try {
    launch_local(many);
    ADD_FAILURE() << "launched 100000 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("at most " + std::to_string(kMaxLocalRanks)),
              std::string::npos)
        << e.what();
  }
}

// `tpcomm launch`'s own checks of -n, --timeout and --grace: the range in words.
TEST(LaunchCommand, StatesTheRangeOfBadValues) {
  const std::string cli = tpcomm::test::built_file(TPCOMM_CLI_PATH);
  const std::pair<const char*, const char*> cases[] = {
      {"-n 0", "from 1 to 1024"},
      {"-n -1", "from 1 to 1024"},
      {"-n 100000", "from 1 to 1024"},
      {"-n two", "from 1 to 1024"},
      {"-n 1 --timeout -1", "0 (no limit) or from 0.001"},
      {"-n 1 --timeout 0.0001", "0 (no limit) or from 0.001"},
      {"-n 1 --timeout 1e30", "too large"},
      {"-n 1 --timeout nan", "not a number"},
      {"-n 1 --timeout soon", "not a number"},
      {"-n 1 --grace 1e30", "too large"},
      {"-n 1 --grace nan", "not a number"},
      {"-n 1 --grace -1", "0 or from 0.001"},
  };
  for (const auto& [args, needle] : cases) {
    const auto r = tpcomm::test::run_program(cli + " launch " + args + " -- true 2>&1");
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("179769"), std::string::npos) << args << ": " << r.output;
  }
  // A timeout of one millisecond is a limit, not "none".
  const auto r = tpcomm::test::run_program(cli + " launch -n 1 --timeout 0.001 -- sleep 5 2>&1");
  EXPECT_EQ(r.exit_code, 124) << r.output;
}

// A program the kernel will not run (no valid format, no interpreter line) is reported with
// the reason, not only its path.
TEST(LaunchCommand, SaysWhyAProgramCouldNotBeExecuted) {
  const std::string cli = tpcomm::test::built_file(TPCOMM_CLI_PATH);
  char dir[] = "/tmp/tpcomm-garbage-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string garbage = std::string(dir) + "/garbage";
  {
    std::FILE* f = std::fopen(garbage.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const unsigned char bytes[] = {0x7f, 0x00, 0x13, 0x37, 0xde, 0xad, 0xbe, 0xef};
    std::fwrite(bytes, 1, sizeof(bytes), f);
    std::fclose(f);
  }
  ASSERT_EQ(::chmod(garbage.c_str(), 0755), 0);
  const auto r = tpcomm::test::run_program(cli + " launch -n 1 -- " + garbage + " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("execve failed for " + garbage + ": Exec format error"),
            std::string::npos)
      << r.output;
  std::remove(garbage.c_str());
  ::rmdir(dir);
}

TEST_F(Launcher, RefusesWhatItCannotStart) {
  auto expect_invalid = [](LaunchSpec s, std::string_view needle) {
    try {
      launch_local(s);
      ADD_FAILURE() << "launched " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  LaunchSpec missing;
  missing.argv = {"tpcomm-no-such-program"};
  expect_invalid(missing, "not found in PATH");
  LaunchSpec not_executable;
  not_executable.argv = {path("")};
  expect_invalid(not_executable, "cannot execute");
  LaunchSpec zero = spec(0, {"exit:0"});
  expect_invalid(zero, "at least 1");
  LaunchSpec empty;
  expect_invalid(empty, "no program");
  // Programs are looked up in PATH.
  LaunchSpec from_path;
  from_path.argv = {"true"};
  from_path.nprocs = 2;
  EXPECT_EQ(launch_local(from_path).exit_code, 0);
}

}  // namespace
}  // namespace tpcomm
