// SPDX-License-Identifier: Apache-2.0
// launch_local: the ranks' program and environment; watching them, stopping all when one fails.
#include "bootstrap/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
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
#include "bootstrap/launcher_processes.hpp"
#include "bootstrap/socket.hpp"
#include "core/check.hpp"
#include "core/log.hpp"

extern char** environ;

namespace tpcomm {
namespace {

using detail::concat;
using launcher::GroupKeeper;
using launcher::kAbandonAfter;
using launcher::kTick;
using launcher::spawn_ranks;
using launcher::Subreaper;
using launcher::Watch;
using std::chrono::milliseconds;

// Exit code of a rank that has nothing to do here (CTest's SKIP_RETURN_CODE).
constexpr int kSkipCode = 77;
// Exit code of a launch whose deadline passed (as timeout(1)).
constexpr int kDeadlineCode = 124;

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

  // Stops the job when one of the ranks that have just ended failed, naming the one that failed
  // first: the loop wakes as each rank ends (`Watch::exit_fds`) and each exit's time is recorded
  // as it is read, so a survivor that exits with an error once its group notices the lost rank
  // comes later. Among exits read together, one killed by a signal is the likelier cause of the
  // others, so it is named first.
  void stop_on_failure(const std::vector<int>& ended) {
    if (phase_ != Phase::kRunning) return;
    const RankExit* first = nullptr;
    for (int r : ended) {
      const RankExit& e = result_.ranks[static_cast<std::size_t>(r)];
      if (!is_failure(e)) continue;
      const bool signaled = e.how == RankExit::How::kSignaled;
      if (first == nullptr || e.ended_at < first->ended_at ||
          (e.ended_at == first->ended_at && signaled && first->how != RankExit::How::kSignaled))
        first = &e;
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
  // Waits until `next`, a signal for the launcher, or a rank's end, and forwards the signals.
  void forward_signals(SignalForwarding& signals, Deadline next) {
    std::vector<pollfd> fds = watch_.exit_fds();
    fds.push_back({signals.fd(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(remaining(next).count()));
    if (rc <= 0 || (fds.back().revents & POLLIN) == 0) return;
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
