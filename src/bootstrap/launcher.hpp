// SPDX-License-Identifier: Apache-2.0
// The local launcher behind `tpcomm launch -n N -- PROGRAM ARGS...` (and `tpcomm bench -g N`).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace tpcomm {

/// The most ranks `launch_local` starts on one machine. Far above the GPUs a host has; a larger
/// count is a typo, and each rank is a process with its own copy of the environment.
inline constexpr int kMaxLocalRanks = 1024;

/// What `launch_local` starts: `nprocs` copies of one program, one per rank.
struct LaunchSpec {
  /// The program and its arguments. A program name without '/' is looked up in PATH.
  std::vector<std::string> argv;
  /// Number of ranks, at least 1.
  int nprocs = 1;
  /// Time allowed for the whole job; zero means none. When it passes, the children still
  /// running are stopped and the launch ends with exit code 124.
  std::chrono::milliseconds timeout{0};
  /// Between the SIGTERM and the SIGKILL of a child the launcher stops.
  std::chrono::milliseconds grace{3000};
  /// Extra variables for every child; they override inherited ones and the launcher's own.
  std::vector<std::pair<std::string, std::string>> env;
  /// MASTER_ADDR of the children: where rank 0 hosts the store.
  std::string master_addr = "127.0.0.1";
  /// MASTER_PORT of the children; 0 picks a port that is free now.
  int master_port = 0;
};

/// How one rank's process ended.
struct RankExit {
  enum class How {
    /// Still running when the launcher gave up on it (it survived SIGKILL).
    kRunning,
    /// Exited; `code` is its exit status.
    kExited,
    /// Killed by `signal`.
    kSignaled,
  };
  int rank = 0;
  pid_t pid = -1;
  How how = How::kRunning;
  int code = 0;
  int signal = 0;
  /// The launcher signalled it (after another rank failed, the deadline, or a forwarded
  /// SIGINT/SIGTERM).
  bool stopped_by_launcher = false;
  /// When the launcher read its exit (steady clock; the launcher wakes as a rank ends): the
  /// rank that ended first is the one the launch's message names.
  std::chrono::steady_clock::time_point ended_at{};
};

/// What `launch_local` reports.
struct LaunchResult {
  /// 0 when every rank exited 0; 77 when every rank exited 0 or 77 and at least one 77 (the
  /// job was skipped); otherwise the first failing rank's exit code, 128 + signal for a rank
  /// killed by a signal or for a SIGINT/SIGTERM the launcher received, 124 when the deadline
  /// passed.
  int exit_code = 0;
  /// Empty when `exit_code` is 0; else the cause, e.g. "rank 2 exited with code 1", "rank 1
  /// killed by signal 9 (SIGKILL)", "deadline of 30 s passed; ranks 0, 3 still running".
  std::string message;
  /// Every rank, indexed by rank.
  std::vector<RankExit> ranks;
};

/// Starts `spec.nprocs` children and waits for all of them. Never touches CUDA: it forks before
/// the parent could have created a CUDA context.
///
/// Every child gets RANK, WORLD_SIZE, LOCAL_RANK (= RANK), LOCAL_WORLD_SIZE (= WORLD_SIZE),
/// MASTER_ADDR, MASTER_PORT, and TPCOMM_STORE_TOKEN (a random token for this launch unless one
/// is set already), then `spec.env`; the explicit TPCOMM_RANK, TPCOMM_WORLD_SIZE,
/// TPCOMM_LOCAL_RANK, TPCOMM_LOCAL_WORLD_SIZE and TPCOMM_STORE_ADDR are removed, since they
/// would override the launcher's numbering. Each child's environment is built just before its
/// fork. Children inherit stdout and stderr, run in their own process groups, and are killed
/// (SIGKILL) if the thread that launched them dies. When the job ends every rank's process group
/// gets SIGKILL, so that nothing a rank started in the background outlives the job; if the
/// launcher process itself dies, a keeper process it forked kills the groups (what can still
/// survive: processes that left their rank's group, e.g. through setsid; NOTE [launcher death]
/// in launcher_processes.hpp). While it runs the process is a child subreaper.
///
/// SIGINT and SIGTERM sent to the launcher while it waits are forwarded to every child (a
/// second one sends SIGKILL). When a rank fails (an exit code other than 0 and 77, or a
/// signal), or the deadline passes, every other child gets SIGTERM, then SIGKILL after
/// `spec.grace`, and is reaped. The call returns once every child is reaped, or a few seconds
/// after SIGKILL for a child that cannot die (reported as `kRunning`); it never waits forever.
///
/// Throws `Error(kInvalidArgument)` for an empty program, `nprocs` outside 1 to
/// `kMaxLocalRanks`, a negative timeout or grace, or a program that cannot be found or
/// executed, and `Error(kSystemError)` when fork fails (the children already started are killed
/// and reaped first). One launch at a time per process: it installs
/// SIGINT/SIGTERM handlers while it runs and restores the previous ones.
LaunchResult launch_local(const LaunchSpec& spec);

/// "rank 2 exited with code 1", "rank 1 killed by signal 9 (SIGKILL)", "rank 0 still running".
std::string describe(const RankExit& r);

/// "SIGKILL", "SIGTERM", ...; "signal N" for others.
std::string signal_name(int sig);

}  // namespace tpcomm
