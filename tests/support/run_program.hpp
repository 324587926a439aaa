// SPDX-License-Identifier: Apache-2.0
// Runs a program through the shell and captures its standard output: for tests of `tpcomm`.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace tpcomm::test {

struct ProgramResult {
  /// The exit code, or -1 when the program did not exit normally.
  int exit_code = -1;
  std::string output;
};

/// Runs `command` with /bin/sh, standard output captured (standard error passes through).
inline ProgramResult run_program(const std::string& command) {
  ProgramResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) {
    result.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace tpcomm::test
