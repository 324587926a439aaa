// SPDX-License-Identifier: Apache-2.0
// The ranks' processes of launch_local: forked and executed, signalled by group, reaped.
#include "bootstrap/launcher_processes.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "bootstrap/deadline.hpp"
#include "core/check.hpp"
#include "core/log.hpp"

namespace tpcomm::launcher {
namespace {

using detail::concat;
using std::chrono::milliseconds;

// How long the teardown reaps the orphans it adopted from the ranks' process groups.
constexpr milliseconds kReapOrphansFor{1000};

// One child's environment, prepared just before its fork (after fork only async-signal-safe
// calls are allowed in the child) and dropped once it is forked: a launch holds one copy of
// the environment at a time, not one per rank.
class ChildEnv {
 public:
  ChildEnv(const std::vector<std::string>& common, int rank) : storage_(common) {
    storage_.push_back(concat("RANK=", rank));
    storage_.push_back(concat("LOCAL_RANK=", rank));
    envp_.reserve(storage_.size() + 1);
    for (std::string& e : storage_) envp_.push_back(e.data());
    envp_.push_back(nullptr);
  }
  [[nodiscard]] char* const* envp() const noexcept { return envp_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<char*> envp_;
};

[[noreturn]] void exec_child(const std::string& path, char* const* argv, char* const* envp,
                             pid_t parent) noexcept {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGINT, &dfl, nullptr);
  ::sigaction(SIGTERM, &dfl, nullptr);
  ::sigaction(SIGPIPE, &dfl, nullptr);
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  // The launcher may have died between fork and prctl; then nobody would kill this child.
  if (::getppid() != parent) ::_exit(128 + SIGKILL);
  // Signals blocked by the launcher while it forked (and any the caller blocked) are delivered
  // from here on, with their default actions.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execve(path.c_str(), argv, envp);
  // Only async-signal-safe calls after fork: strerrordesc_np reads a static table (no locale).
  const char* why = ::strerrordesc_np(errno);
  if (why == nullptr) why = "unknown error";
  static constexpr char kMsg[] = "tpcomm launch: execve failed for ";
  ssize_t rc = ::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  rc = ::write(STDERR_FILENO, path.c_str(), path.size());
  rc = ::write(STDERR_FILENO, ": ", 2);
  rc = ::write(STDERR_FILENO, why, std::strlen(why));
  rc = ::write(STDERR_FILENO, "\n", 1);
  (void)rc;
  ::_exit(127);
}

// SIGKILLs the children started so far and reaps them, giving up after `kAbandonAfter`.
void kill_and_reap(Watch& watch) {
  watch.signal_all(SIGKILL);
  const Deadline give_up = deadline_after(kAbandonAfter);
  while (!watch.running().empty() && SteadyClock::now() < give_up) {
    watch.reap();
    ::poll(nullptr, 0, static_cast<int>(kTick.count()));
  }
  watch.tear_down();
}

}  // namespace

GroupKeeper::GroupKeeper() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    TPCOMM_LOG_WARN("launch: socketpair: ", std::strerror(errno),
                    "; the ranks' children may outlive a killed launcher");
    return;
  }
  const pid_t pid = ::fork();
  if (pid == 0) run(sv[0], sv[1]);
  ::close(sv[0]);
  if (pid < 0) {
    TPCOMM_LOG_WARN("launch: fork of the group keeper: ", std::strerror(errno),
                    "; the ranks' children may outlive a killed launcher");
    ::close(sv[1]);
    return;
  }
  pid_ = pid;
  fd_ = sv[1];
}

void GroupKeeper::release() noexcept {
  if (fd_ < 0) return;
  send(0);
  ::close(fd_);
  fd_ = -1;
  const Deadline give_up = deadline_after(kAbandonAfter);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (SteadyClock::now() >= give_up) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    ::poll(nullptr, 0, 1);
  }
}

void GroupKeeper::send(pid_t v) noexcept {
  if (fd_ < 0) return;
  // A few bytes on a local stream socket: written whole or not at all; MSG_NOSIGNAL, since a
  // dead keeper must not take the launcher with it.
  ssize_t rc;
  do {
    rc = ::send(fd_, &v, sizeof(v), MSG_NOSIGNAL);
  } while (rc < 0 && errno == EINTR);
}

void GroupKeeper::run(int fd, int launcher_end) noexcept {
  ::close(launcher_end);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &ign, nullptr);
  ::setpgid(0, 0);  // out of the launcher's group, so that a kill of that group spares it
  std::array<pid_t, kMaxLocalRanks> groups{};
  std::size_t n = 0;
  std::size_t have = 0;
  pid_t v = 0;
  for (;;) {
    const ssize_t got = ::read(fd, reinterpret_cast<char*>(&v) + have, sizeof(v) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // end of file: the launcher is gone
    have += static_cast<std::size_t>(got);
    if (have < sizeof(v)) continue;
    have = 0;
    if (v == 0) ::_exit(0);
    if (n < groups.size()) groups[n++] = v;
  }
  for (std::size_t i = 0; i < n; ++i) ::kill(-groups[i], SIGKILL);
  ::_exit(0);
}

Subreaper::Subreaper() {
  int old = 0;
  if (::prctl(PR_GET_CHILD_SUBREAPER, &old) == 0) was_ = old != 0;
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
}

Subreaper::~Subreaper() {
  if (!was_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

void Watch::signal_all(int sig) {
  for (RankExit& r : ranks_) {
    if (r.pid <= 0) continue;
    const bool running = r.how == RankExit::How::kRunning;
    if (running) r.stopped_by_launcher = true;
    if (::kill(-r.pid, sig) != 0 && running) ::kill(r.pid, sig);
  }
}

std::vector<int> Watch::reap() {
  std::vector<int> ended;
  // One time for the exits read together: their order within the pass is unknown.
  const auto now = SteadyClock::now();
  for (RankExit& r : ranks_) {
    if (r.how != RankExit::How::kRunning || r.pid <= 0) continue;
    siginfo_t info{};
    int rc;
    do {
      info.si_pid = 0;
      rc = ::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT);
    } while (rc < 0 && errno == EINTR);
    if (rc == 0 && info.si_pid == 0) continue;
    if (rc < 0) {
      // ECHILD: someone else reaped it (a SIGCHLD set to SIG_IGN); its status is lost.
      r.how = RankExit::How::kExited;
      r.code = 0;
      TPCOMM_LOG_WARN("launch: rank ", r.rank, " (pid ", r.pid,
                      ") was reaped elsewhere; its exit status is unknown");
      reaped_.insert(r.rank);
    } else if (info.si_code == CLD_EXITED) {
      r.how = RankExit::How::kExited;
      r.code = info.si_status;
    } else if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
      r.how = RankExit::How::kSignaled;
      r.signal = info.si_status;
    } else {
      continue;
    }
    r.ended_at = now;
    ended.push_back(r.rank);
  }
  return ended;
}

Watch::~Watch() {
  for (const int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

std::vector<pollfd> Watch::exit_fds() {
  pidfds_.resize(ranks_.size(), -1);
  std::vector<pollfd> fds;
  for (const RankExit& r : ranks_) {
    if (r.how != RankExit::How::kRunning || r.pid <= 0) continue;
    int& fd = pidfds_[static_cast<std::size_t>(r.rank)];
#ifdef SYS_pidfd_open
    if (fd < 0) fd = static_cast<int>(::syscall(SYS_pidfd_open, r.pid, 0));
#endif
    if (fd < 0) return {};  // no pidfds here: the loop's tick reads the exits
    fds.push_back({fd, POLLIN, 0});
  }
  return fds;
}

void Watch::tear_down() {
  for (const RankExit& r : ranks_)
    if (r.pid > 0) ::kill(-r.pid, SIGKILL);
  std::vector<pid_t> groups;
  for (const RankExit& r : ranks_) {
    if (r.pid <= 0 || r.how == RankExit::How::kRunning) continue;
    if (!reaped_.contains(r.rank)) {
      int status = 0;
      while (::waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    groups.push_back(r.pid);
  }
  const Deadline give_up = deadline_after(kReapOrphansFor);
  while (!groups.empty()) {
    std::erase_if(groups, [](pid_t group) {
      int status = 0;
      pid_t got;
      while ((got = ::waitpid(-group, &status, WNOHANG)) > 0 || (got < 0 && errno == EINTR)) {
      }
      return got < 0;  // ECHILD: nothing of that group is this process's child any more
    });
    if (groups.empty() || SteadyClock::now() >= give_up) break;
    ::poll(nullptr, 0, static_cast<int>(kTick.count()));
  }
}

std::vector<int> Watch::running() const {
  std::vector<int> out;
  for (const RankExit& r : ranks_)
    if (r.how == RankExit::How::kRunning && r.pid > 0) out.push_back(r.rank);
  return out;
}

void spawn_ranks(const std::string& program, char* const* argv,
                 const std::vector<std::string>& common, std::optional<GroupKeeper>& keeper,
                 Watch& watch, std::vector<RankExit>& ranks) {
  const pid_t self = ::getpid();
  std::fflush(nullptr);  // buffered output would otherwise be written once per child too
  // A SIGINT/SIGTERM must not reach a child before it has dropped the launcher's handler (it
  // would report the signal through the launcher's pipe instead of dying): block them while
  // forking; each child unblocks them after restoring the default actions.
  sigset_t stop_signals;
  sigset_t previous_mask;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, &previous_mask);
  struct RestoreMask {
    const sigset_t& mask;
    bool done = false;
    void operator()() {
      if (!done) ::pthread_sigmask(SIG_SETMASK, &mask, nullptr);
      done = true;
    }
    ~RestoreMask() { (*this)(); }
  } restore_mask{previous_mask};
  keeper.emplace();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const ChildEnv env(common, static_cast<int>(r));
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(program, argv, env.envp(), self);
    if (pid < 0) {
      const int err = errno;
      restore_mask();
      kill_and_reap(watch);
      TPCOMM_THROW(Status::kSystemError, "launch: fork for rank ", r,
                   " failed: ", std::strerror(err));
    }
    // Also set here, so that signalling the group works even before the child has run.
    ::setpgid(pid, pid);
    ranks[r].pid = pid;
    keeper->add(pid);
  }
}

}  // namespace tpcomm::launcher
