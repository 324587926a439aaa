// SPDX-License-Identifier: Apache-2.0
// Forked child processes for tests that need real processes (store clients, ranks).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <thread>

namespace tpcomm::testing {

/// Runs `body` in a forked child that exits 0 when it returns and 1 when it throws (printing
/// the exception). The child never returns into the test framework. Use plain checks that
/// throw inside `body`: gtest assertions in a child are lost.
inline pid_t fork_child(const std::function<void()>& body) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      code = 1;
    } catch (...) {
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

/// The child's exit code; 128 + signal when killed; -1 when it did not end within `timeout`
/// (it is then killed and reaped).
inline int wait_child(pid_t pid, std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (got < 0) return -2;
    if (std::chrono::steady_clock::now() > give_up) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

/// Polls `cond` until it holds or `timeout` passes; returns its last value. For observing state
/// that another thread or process changes, not for ordering.
template <class Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > give_up) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace tpcomm::testing
