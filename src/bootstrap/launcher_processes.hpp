// SPDX-License-Identifier: Apache-2.0
// The ranks' processes of launch_local: their process groups, the group keeper, forking, reaping.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/launcher.hpp"

namespace tpcomm::launcher {

// How long the launcher waits for children after SIGKILL before it gives up on them.
inline constexpr std::chrono::milliseconds kAbandonAfter{5000};
// Longest sleep of the watch loop between checks of the children.
inline constexpr std::chrono::milliseconds kTick{20};

// NOTE [rank process groups]
// Each rank runs in its own process group (its pgid is its pid; the child and the launcher both
// set it, so that it holds whichever runs first), and the launcher signals whole groups: what a
// rank started in the background belongs to the job. A rank's leader is reaped only at the very
// end (its exit is read with WNOWAIT): while it is an unreaped zombie its pid cannot be reused,
// so kill(-pgid) never reaches a stranger's group. When the job ends, every group gets SIGKILL,
// whether its rank succeeded, failed or was stopped. During the launch the launcher is a child
// subreaper (PR_SET_CHILD_SUBREAPER), so the groups' orphans become its children and are reaped
// at the end (for at most kReapOrphansFor) instead of piling up as zombies under init.
//
// NOTE [launcher death]
// If the launcher itself dies (SIGKILL included), PR_SET_PDEATHSIG kills each rank's leader,
// but not the leader's own children: the death signal is not inherited across fork. A keeper
// process, forked before the ranks and in its own process group, learns each rank's group over
// a socket whose other end only the launcher holds. A normal end tells it so and it exits; when
// the launcher dies the socket reads end-of-file and the keeper SIGKILLs every rank's group.
// What survives a SIGKILL of the launcher: processes that left their rank's group (setsid,
// daemons, `setsid cmd &`), and everything below a leader when the keeper is killed with the
// launcher (a kill of both by pid, or of the keeper first). A cgroup (systemd-run --scope,
// the batch system's job) is the only complete fence.
class GroupKeeper {
 public:
  // Forks the keeper; call with SIGINT/SIGTERM blocked (the child must not run the launcher's
  // handlers). Without a keeper (socketpair or fork failed) the launch goes on, with the gap
  // above open, and says so.
  GroupKeeper();
  ~GroupKeeper() { release(); }
  GroupKeeper(const GroupKeeper&) = delete;
  GroupKeeper& operator=(const GroupKeeper&) = delete;

  // Tells the keeper about the group of a rank just forked.
  void add(pid_t group) noexcept { send(group); }

  // The launcher has torn the groups down itself: the keeper exits without signalling, and is
  // reaped (bounded; killed if it does not exit).
  void release() noexcept;

 private:
  void send(pid_t v) noexcept;

  // The keeper: only async-signal-safe calls (it was forked from a process that may have
  // threads).
  [[noreturn]] static void run(int fd, int launcher_end) noexcept;

  pid_t pid_ = -1;
  int fd_ = -1;
};

// Makes the launcher a child subreaper while it runs (NOTE [rank process groups]), and restores
// the previous setting.
class Subreaper {
 public:
  Subreaper();
  ~Subreaper();
  Subreaper(const Subreaper&) = delete;
  Subreaper& operator=(const Subreaper&) = delete;

 private:
  bool was_ = false;
};

// The ranks' leaders, by rank: their process groups signalled, their exits read, and at the end
// their groups reaped.
class Watch {
 public:
  explicit Watch(std::vector<RankExit>& ranks) : ranks_(ranks) {}
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // Signals every rank's process group, the ranks that have ended included: what they left
  // running is part of the job (NOTE [rank process groups]).
  void signal_all(int sig);

  // Reads the exit of the ranks that have ended, leaving them unreaped (NOTE [rank process
  // groups]); returns the ranks that ended now.
  std::vector<int> reap();

  // The end of the launch: SIGKILL to every rank's group, then the ended leaders and the
  // groups' adopted orphans are reaped (NOTE [rank process groups]). Bounded.
  void tear_down();

  [[nodiscard]] std::vector<int> running() const;

  // One pollfd per running rank that becomes readable when the rank ends (a pidfd), so that
  // the watch loop wakes as each rank ends and `reap` reads the exits in the order they came.
  // Empty where the kernel has no pidfds (the loop then wakes every `kTick`).
  [[nodiscard]] std::vector<pollfd> exit_fds();

 private:
  std::vector<RankExit>& ranks_;
  // The pidfd of each rank's leader, by rank (-1: not opened or not available). A leader stays
  // unreaped until `tear_down`, so its pid, and the pidfd, cannot name another process.
  std::vector<int> pidfds_;
  // Ranks whose exit status was collected by someone else (ECHILD): nothing left to reap.
  std::set<int> reaped_;
};

// Forks the keeper, then forks and executes every rank, recording each pid in `ranks`; each
// rank's environment is `common` and its numbering. When a fork fails, the children already
// started are killed and reaped, and it throws.
void spawn_ranks(const std::string& program, char* const* argv,
                 const std::vector<std::string>& common, std::optional<GroupKeeper>& keeper,
                 Watch& watch, std::vector<RankExit>& ranks);

}  // namespace tpcomm::launcher
