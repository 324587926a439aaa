// SPDX-License-Identifier: Apache-2.0
#include "coordinator/watchdog.hpp"

#include <cstdlib>

#include "core/log.hpp"

namespace tpcomm {

Watchdog::Watchdog(std::string name, FailureMode mode, Check check, Raise raise)
    : name_(std::move(name)),
      check_(std::move(check)),
      raise_(std::move(raise)),
      mode_(mode),
      thread_([this] { run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::set_mode(FailureMode mode, Handler handler) {
  std::lock_guard lock(mu_);
  mode_ = mode;
  handler_ = std::move(handler);
}

void Watchdog::run() noexcept {
  std::optional<Failure> failure;
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    failure = check_();
    lock.lock();
    if (failure || cv_.wait_for(lock, kPeriod, [&] { return stop_; })) break;
  }
  if (!failure || stop_) return;
  const FailureMode mode = mode_;
  const Handler handler = handler_;
  lock.unlock();
  const auto& [status, message] = *failure;
  TPCOMM_LOG_ERROR(name_, ": ", to_string(status), ": ", message, "; the group has failed",
                   mode == FailureMode::kTeardown
                       ? "; taking the process down (TPCOMM_ASYNC_ERROR_HANDLING=teardown)"
                       : "");
  if (mode == FailureMode::kTeardown) std::abort();  // NOTE [watchdog]: by request
  raise_(*failure);
  if (mode == FailureMode::kCallback && handler) {
    try {
      handler(status, message);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a handler's exception cannot go anywhere
    }
  }
}

}  // namespace tpcomm
