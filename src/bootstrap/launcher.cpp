// SPDX-License-Identifier: Apache-2.0
// launch_local: fork/exec the ranks, watch them, stop them all when one fails.
#include "bootstrap/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string_view>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "core/check.hpp"
#include "core/log.hpp"

extern char** environ;

namespace tpcomm {
namespace {

using detail::concat;
using std::chrono::milliseconds;

// Exit code of a rank that has nothing to do here (CTest's SKIP_RETURN_CODE).
constexpr int kSkipCode = 77;
// Exit code of a launch whose deadline passed (as timeout(1)).
constexpr int kDeadlineCode = 124;
// How long the launcher waits for children after SIGKILL before it gives up on them.
constexpr milliseconds kAbandonAfter{5000};
// Longest sleep of the watch loop between checks of the children.
constexpr milliseconds kTick{20};
// How long the teardown reaps the orphans it adopted from the ranks' process groups.
constexpr milliseconds kReapOrphansFor{1000};

// Variables the launcher sets, and the explicit ones that would override them.
constexpr std::array<const char*, 11> kManagedVars{"RANK",
                                                   "WORLD_SIZE",
                                                   "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE",
                                                   "MASTER_ADDR",
                                                   "MASTER_PORT",
                                                   "TPCOMM_RANK",
                                                   "TPCOMM_WORLD_SIZE",
                                                   "TPCOMM_LOCAL_RANK",
                                                   "TPCOMM_LOCAL_WORLD_SIZE",
                                                   "TPCOMM_STORE_ADDR"};

// NOTE [launcher signals]
// SIGINT/SIGTERM handlers only write the signal number into a non-blocking pipe (write is
// async-signal-safe); the watch loop reads it. One launch runs at a time per process.
std::atomic<int> g_signal_pipe{-1};
std::mutex g_launch_mu;

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char b = static_cast<unsigned char>(sig);
    ssize_t rc = ::write(fd, &b, 1);
    (void)rc;
  }
  errno = saved;
}

class SignalForwarding {
 public:
  SignalForwarding() {
    int p[2];
    TPCOMM_CHECK(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0, Status::kSystemError,
                 "pipe2: ", std::strerror(errno));
    read_fd_ = p[0];
    write_fd_ = p[1];
    g_signal_pipe.store(write_fd_);
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    g_signal_pipe.store(-1);
    ::close(read_fd_);
    ::close(write_fd_);
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

  [[nodiscard]] int fd() const noexcept { return read_fd_; }

  // Signals received since the last call.
  std::vector<int> take() {
    std::vector<int> out;
    unsigned char buf[16];
    ssize_t n;
    while ((n = ::read(read_fd_, buf, sizeof(buf))) > 0) out.insert(out.end(), buf, buf + n);
    return out;
  }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    TPCOMM_CHECK(is_executable_file(name), Status::kInvalidArgument, "cannot execute \"", name,
                 "\": not an executable file");
    return name;
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    auto colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = concat(dir.empty() ? "." : dir, "/", name);
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  TPCOMM_THROW(Status::kInvalidArgument, "program \"", name, "\" not found in PATH");
}

std::string random_token() {
  std::random_device rd;
  std::string out;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    std::uint32_t v = rd();
    for (int j = 0; j < 4; ++j) {
      out += kHex[(v >> 4) & 0xF];
      out += kHex[v & 0xF];
      v >>= 8;
    }
  }
  return out;
}

std::string variable_name(const char* entry) {
  const char* eq = std::strchr(entry, '=');
  return eq == nullptr ? std::string(entry) : std::string(entry, eq);
}

std::string format_seconds(milliseconds ms) {
  if (ms.count() % 1000 == 0) return concat(ms.count() / 1000, " s");
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += concat(i == 0 ? "" : ", ", ranks[i]);
  return out;
}

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
  GroupKeeper() {
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
  ~GroupKeeper() { release(); }
  GroupKeeper(const GroupKeeper&) = delete;
  GroupKeeper& operator=(const GroupKeeper&) = delete;

  // Tells the keeper about the group of a rank just forked.
  void add(pid_t group) noexcept { send(group); }

  // The launcher has torn the groups down itself: the keeper exits without signalling, and is
  // reaped (bounded; killed if it does not exit).
  void release() noexcept {
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

 private:
  void send(pid_t v) noexcept {
    if (fd_ < 0) return;
    // A few bytes on a local stream socket: written whole or not at all; MSG_NOSIGNAL, since a
    // dead keeper must not take the launcher with it.
    ssize_t rc;
    do {
      rc = ::send(fd_, &v, sizeof(v), MSG_NOSIGNAL);
    } while (rc < 0 && errno == EINTR);
  }

  // The keeper: only async-signal-safe calls (it was forked from a process that may have
  // threads).
  [[noreturn]] static void run(int fd, int launcher_end) noexcept {
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

  pid_t pid_ = -1;
  int fd_ = -1;
};

// Makes the launcher a child subreaper while it runs (NOTE [rank process groups]), and restores
// the previous setting.
class Subreaper {
 public:
  Subreaper() {
    int old = 0;
    if (::prctl(PR_GET_CHILD_SUBREAPER, &old) == 0) was_ = old != 0;
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  ~Subreaper() {
    if (!was_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
  Subreaper(const Subreaper&) = delete;
  Subreaper& operator=(const Subreaper&) = delete;

 private:
  bool was_ = false;
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

class Watch {
 public:
  explicit Watch(std::vector<RankExit>& ranks) : ranks_(ranks) {}

  // Signals every rank's process group, the ranks that have ended included: what they left
  // running is part of the job (NOTE [rank process groups]).
  void signal_all(int sig) {
    for (RankExit& r : ranks_) {
      if (r.pid <= 0) continue;
      const bool running = r.how == RankExit::How::kRunning;
      if (running) r.stopped_by_launcher = true;
      if (::kill(-r.pid, sig) != 0 && running) ::kill(r.pid, sig);
    }
  }

  // Reads the exit of the ranks that have ended, leaving them unreaped (NOTE [rank process
  // groups]); returns the ranks that ended now.
  std::vector<int> reap() {
    std::vector<int> ended;
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
      ended.push_back(r.rank);
    }
    return ended;
  }

  // The end of the launch: SIGKILL to every rank's group, then the ended leaders and the
  // groups' adopted orphans are reaped (NOTE [rank process groups]). Bounded.
  void tear_down() {
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

  [[nodiscard]] std::vector<int> running() const {
    std::vector<int> out;
    for (const RankExit& r : ranks_)
      if (r.how == RankExit::How::kRunning && r.pid > 0) out.push_back(r.rank);
    return out;
  }

 private:
  std::vector<RankExit>& ranks_;
  // Ranks whose exit status was collected by someone else (ECHILD): nothing left to reap.
  std::set<int> reaped_;
};

bool is_failure(const RankExit& r) {
  return r.how == RankExit::How::kSignaled ||
         (r.how == RankExit::How::kExited && r.code != 0 && r.code != kSkipCode);
}

void check_spec(const LaunchSpec& spec) {
  TPCOMM_CHECK(!spec.argv.empty() && !spec.argv[0].empty(), Status::kInvalidArgument,
               "launch: no program given");
  TPCOMM_CHECK(spec.nprocs >= 1 && spec.nprocs <= kMaxLocalRanks, Status::kInvalidArgument,
               "launch: the number of processes (", spec.nprocs,
               ") must be at least 1 and at most ", kMaxLocalRanks);
  TPCOMM_CHECK(spec.timeout.count() >= 0, Status::kInvalidArgument, "launch: the timeout (",
               spec.timeout.count(), " ms) is negative");
  TPCOMM_CHECK(spec.grace.count() >= 0, Status::kInvalidArgument, "launch: the grace period (",
               spec.grace.count(), " ms) is negative");
}

// The environment every child shares: the inherited variables, less those the launcher manages
// or `spec.env` sets; then the job's size, MASTER_ADDR, MASTER_PORT and, unless a non-empty
// token or token file is set, a store token (an empty one means "no token", which would leave
// the store open: it is replaced); then `spec.env`.
std::vector<std::string> common_environment(const LaunchSpec& spec, int port) {
  constexpr std::string_view kToken = "TPCOMM_STORE_TOKEN";
  std::set<std::string> overridden(kManagedVars.begin(), kManagedVars.end());
  for (const auto& [name, value] : spec.env) overridden.insert(name);
  auto is_set = [&](std::string_view var) {
    const auto given = std::find_if(spec.env.begin(), spec.env.end(),
                                    [&](const auto& kv) { return kv.first == var; });
    if (given != spec.env.end()) return !given->second.empty();
    const char* inherited = std::getenv(std::string(var).c_str());
    return inherited != nullptr && *inherited != '\0';
  };
  const bool has_token = is_set(kToken) || is_set("TPCOMM_STORE_TOKEN_FILE");
  if (!has_token) overridden.insert(std::string(kToken));
  std::vector<std::string> common;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (!overridden.contains(variable_name(*e))) common.emplace_back(*e);
  }
  common.push_back(concat("WORLD_SIZE=", spec.nprocs));
  common.push_back(concat("LOCAL_WORLD_SIZE=", spec.nprocs));
  common.push_back(concat("MASTER_ADDR=", spec.master_addr));
  common.push_back(concat("MASTER_PORT=", port));
  if (!has_token) common.push_back(concat(kToken, "=", random_token()));
  for (const auto& [name, value] : spec.env)
    if (has_token || name != kToken) common.push_back(concat(name, "=", value));
  return common;
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

// Forks the keeper, then forks and executes every rank, recording each pid in `ranks`; each
// rank's environment is `common` and its numbering. When a fork fails, the children already
// started are killed and reaped, and it throws.
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

// Watches the started ranks until every one is reaped: stops them all when one fails, the
// deadline passes or the launcher receives SIGINT/SIGTERM (SIGTERM or the signal, then SIGKILL
// after the grace period), and gives up on those that survive SIGKILL.
class Supervisor {
 public:
  Supervisor(const LaunchSpec& spec, Watch& watch, LaunchResult& result)
      : spec_(spec),
        watch_(watch),
        result_(result),
        job_deadline_(spec.timeout.count() > 0 ? deadline_after(spec.timeout) : kNoDeadline) {}

  void run(SignalForwarding& signals) {
    for (;;) {
      stop_on_failure(watch_.reap());
      const std::vector<int> running = watch_.running();
      if (running.empty()) return;
      const auto now = SteadyClock::now();
      if (!enforce_deadlines(running, now)) return;
      const Deadline next = std::min({job_deadline_, kill_at_, abandon_at_, now + kTick});
      forward_signals(signals, next);
    }
  }

  // The exit code of the first cause of stopping the job; nullopt when nothing stopped it.
  [[nodiscard]] std::optional<int> stop_code() const { return primary_code_; }

 private:
  enum class Phase { kRunning, kTerminating, kKilling };

  void begin_stop(int sig, std::string why, int code) {
    if (!primary_code_) {
      primary_code_ = code;
      result_.message = std::move(why);
    }
    watch_.signal_all(sig);
    phase_ = Phase::kTerminating;
    kill_at_ = deadline_after(spec_.grace);
  }

  void kill_all() {
    watch_.signal_all(SIGKILL);
    phase_ = Phase::kKilling;
    abandon_at_ = deadline_after(kAbandonAfter);
  }

  // Stops the job when one of the ranks that have just ended failed, naming the one that most
  // likely failed first: ranks reaped in the same tick ended within milliseconds of each other,
  // and one killed by a signal is the cause of ones that then exited with an error (a survivor
  // exits with one once its group notices the lost rank), so it is named first.
  void stop_on_failure(const std::vector<int>& ended) {
    if (phase_ != Phase::kRunning) return;
    const RankExit* first = nullptr;
    for (int r : ended) {
      const RankExit& e = result_.ranks[static_cast<std::size_t>(r)];
      if (!is_failure(e)) continue;
      const bool signaled = e.how == RankExit::How::kSignaled;
      if (first == nullptr || (signaled && first->how != RankExit::How::kSignaled)) first = &e;
    }
    if (first != nullptr)
      begin_stop(SIGTERM, describe(*first),
                 first->how == RankExit::How::kSignaled ? 128 + first->signal : first->code);
  }

  // The job's deadline, then the grace period, then the wait after SIGKILL; false when the
  // launcher gives up on the `running` ranks.
  bool enforce_deadlines(const std::vector<int>& running, Deadline now) {
    if (phase_ == Phase::kRunning && now >= job_deadline_) {
      begin_stop(SIGTERM,
                 concat("deadline of ", format_seconds(spec_.timeout), " passed; ",
                        rank_list(running), " still running"),
                 kDeadlineCode);
    } else if (phase_ == Phase::kTerminating && now >= kill_at_) {
      kill_all();
    } else if (phase_ == Phase::kKilling && now >= abandon_at_) {
      TPCOMM_LOG_ERROR("launch: ", rank_list(running), " did not exit after SIGKILL; giving up");
      result_.message += concat("; ", rank_list(running), " did not exit after SIGKILL");
      return false;
    }
    return true;
  }

  // Waits until `next` or a signal to the launcher, and forwards signals to every rank: the
  // first stops the job with it, one during the grace period kills the ranks.
  void forward_signals(SignalForwarding& signals, Deadline next) {
    pollfd p{signals.fd(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(remaining(next).count()));
    if (rc <= 0) return;
    for (int sig : signals.take()) {
      if (phase_ == Phase::kRunning) {
        TPCOMM_LOG_WARN("launch: received ", signal_name(sig), "; forwarding it to every rank");
        begin_stop(sig, concat("the launcher received ", signal_name(sig)), 128 + sig);
      } else if (phase_ == Phase::kTerminating) {
        kill_all();
      }
    }
  }

  const LaunchSpec& spec_;
  Watch& watch_;
  LaunchResult& result_;
  Phase phase_ = Phase::kRunning;
  const Deadline job_deadline_;
  Deadline kill_at_ = kNoDeadline;
  Deadline abandon_at_ = kNoDeadline;
  std::optional<int> primary_code_;
};

// The launch's exit code and message once every rank is reaped: the cause that stopped the
// job, else 77 when some rank skipped, else 0.
void set_exit_code(LaunchResult& result, std::optional<int> stop_code) {
  if (stop_code) {
    result.exit_code = *stop_code;
    return;
  }
  std::vector<int> skipped;
  for (const RankExit& r : result.ranks)
    if (r.code == kSkipCode) skipped.push_back(r.rank);
  if (!skipped.empty()) {
    result.exit_code = kSkipCode;
    result.message =
        concat(skipped.size() == result.ranks.size() ? "every rank" : rank_list(skipped),
               " exited with code 77 (skipped)");
  }
}

}  // namespace

std::string signal_name(int sig) {
  static constexpr std::array<std::pair<int, const char*>, 22> kNames{{
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  }};
  for (const auto& [n, name] : kNames)
    if (n == sig) return name;
  return concat("signal ", sig);
}

std::string describe(const RankExit& r) {
  switch (r.how) {
    case RankExit::How::kExited:
      return concat("rank ", r.rank, " exited with code ", r.code);
    case RankExit::How::kSignaled:
      return concat("rank ", r.rank, " killed by signal ", r.signal, " (", signal_name(r.signal),
                    ")");
    case RankExit::How::kRunning:
      return concat("rank ", r.rank, " still running");
  }
  return "?";
}

LaunchResult launch_local(const LaunchSpec& spec) {
  check_spec(spec);
  std::unique_lock launch_lock(g_launch_mu, std::try_to_lock);
  TPCOMM_CHECK(launch_lock.owns_lock(), Status::kInvalidArgument,
               "launch: another launch is running in this process");

  const std::string program = find_program(spec.argv[0]);
  const int port = spec.master_port != 0 ? spec.master_port : net::free_port();
  const std::vector<std::string> common = common_environment(spec, port);
  std::vector<std::string> argv_storage = spec.argv;
  std::vector<char*> argv;
  argv.reserve(argv_storage.size() + 1);
  for (std::string& s : argv_storage) argv.push_back(s.data());
  argv.push_back(nullptr);

  LaunchResult result;
  result.ranks.resize(static_cast<std::size_t>(spec.nprocs));
  for (int r = 0; r < spec.nprocs; ++r) result.ranks[static_cast<std::size_t>(r)].rank = r;
  Watch watch(result.ranks);
  SignalForwarding signals;
  Subreaper subreaper;
  std::optional<GroupKeeper> keeper;
  spawn_ranks(program, argv.data(), common, keeper, watch, result.ranks);
  TPCOMM_LOG_INFO("launch: started ", spec.nprocs, " ranks of ", program, ", MASTER_PORT=", port);

  Supervisor supervisor(spec, watch, result);
  supervisor.run(signals);
  watch.tear_down();
  keeper->release();
  set_exit_code(result, supervisor.stop_code());
  return result;
}

}  // namespace tpcomm
