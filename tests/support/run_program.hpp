// SPDX-License-Identifier: Apache-2.0
// Runs a program through the shell and captures its standard output: for tests of `tpcomm`.
#pragma once

#include <sys/wait.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
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

/// A file the build made, given its path at build time. When the build tree was moved (to run
/// the tests on another machine), finds it beside this executable or in ../lib.
inline std::string built_file(const char* build_path) {
  namespace fs = std::filesystem;
  if (fs::exists(build_path)) return build_path;
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  const fs::path name = fs::path(build_path).filename();
  for (const fs::path& candidate : {exe_dir / name, exe_dir / ".." / "lib" / name})
    if (fs::exists(candidate)) return candidate.string();
  return build_path;
}

}  // namespace tpcomm::test
