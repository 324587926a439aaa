// SPDX-License-Identifier: Apache-2.0
// A group's watchdog: notices a failure without the caller asking, and acts on it once.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {

// NOTE [watchdog]
// A thread per group polls, every `kPeriod`, what the group's kernels reported (the host-mapped
// error word), the abort requests of the rank watch, and its NCCL communicator (its asynchronous
// error, and eager work unfinished past the deadline: `NcclComm::poll`, which aborts NCCL on
// either), so that a failure is noticed and acted on
// though the caller never calls again (a CUDA graph replayed in a loop). On the first failure it
// logs the group, the rank and the fault once, then, by the failure mode, marks the group failed
// (raise: the kernels give up, the next call fails), also calls the caller's handler (callback),
// or takes the process down (teardown: the one place where the library ends the process, by
// request, as PyTorch's process groups do). Whatever the mode, acting on a failure aborts the
// custom kernels and NCCL, so that the kernels already enqueued, graph-replayed ones included,
// return. Its `check` reads only what is safe from another thread, and it never launches work.
class Watchdog {
 public:
  static constexpr auto kPeriod = std::chrono::milliseconds(10);

  /// A failure: its status and message.
  using Failure = std::pair<Status, std::string>;
  /// The failure to act on, if any; called on the watchdog's thread.
  using Check = std::function<std::optional<Failure>()>;
  /// Marks the group failed (the raise mode, which the callback mode includes).
  using Raise = std::function<void(const Failure&)>;
  /// The caller's handler of the callback mode.
  using Handler = std::function<void(Status, const std::string&)>;

  /// Starts the thread. `name` says which group and rank, for the log line.
  Watchdog(std::string name, FailureMode mode, Check check, Raise raise);
  /// Stops the thread (at once, also while it waits) and joins it.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Thread-safe.
  void set_mode(FailureMode mode, Handler handler);

 private:
  void run() noexcept;

  std::string name_;
  Check check_;
  Raise raise_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;   // guarded by mu_
  FailureMode mode_;    // guarded by mu_
  Handler handler_;     // guarded by mu_
  std::thread thread_;  // last: started once the rest is ready
};

}  // namespace tpcomm
