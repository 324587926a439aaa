// SPDX-License-Identifier: Apache-2.0
// A stand-in rank for the launcher tests. Usage: fake_rank STEPS [STEPS...]
//
// Rank r (from RANK) runs argument r + 1, or the last argument when there are fewer. STEPS is a
// comma-separated list of steps, run in order:
//   exit:N          exit with code N
//   sleep:S         sleep S seconds (fractions allowed)
//   signal:N        raise signal N
//   ignore-term     ignore SIGTERM from now on
//   touch:PREFIX    create the file PREFIX<rank>
//   await:PATH      wait (at most 10 s, else exit 99) until PATH exists
//   pid:PREFIX      write this process's id to the file PREFIX<rank>
//   await-gone:PATH wait (at most 10 s, else exit 99) until PATH holds a process id and that
//                   process is gone (reaped by its parent, the launcher)
//   env:PREFIX      write RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                   MASTER_PORT, TPCOMM_STORE_TOKEN, TPCOMM_STORE_TOKEN_FILE, TPCOMM_RANK and
//                   TPCOMM_TEST_EXTRA as NAME=VALUE lines to PREFIX<rank>
// After the last step it exits 0.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

int run_step(const std::string& step, const std::string& rank) {
  const auto colon = step.find(':');
  const std::string name = step.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : step.substr(colon + 1);
  if (name == "exit") std::exit(std::atoi(arg.c_str()));
  if (name == "sleep") {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(arg.c_str())));
  } else if (name == "signal") {
    std::raise(std::atoi(arg.c_str()));
  } else if (name == "ignore-term") {
    std::signal(SIGTERM, SIG_IGN);
  } else if (name == "touch") {
    std::ofstream(arg + rank) << "ready\n";
  } else if (name == "await") {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!exists(arg)) {
      if (std::chrono::steady_clock::now() > give_up) return 99;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } else if (name == "pid") {
    const std::string tmp = arg + rank + ".tmp";
    std::ofstream(tmp) << ::getpid() << "\n";
    std::rename(tmp.c_str(), (arg + rank).c_str());
  } else if (name == "await-gone") {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      pid_t pid = 0;
      if (std::ifstream in(arg); in >> pid && pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
        break;
      if (std::chrono::steady_clock::now() > give_up) return 99;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } else if (name == "env") {
    const std::string tmp = arg + rank + ".tmp";
    {
      std::ofstream out(tmp);
      for (const char* var :
           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TPCOMM_STORE_TOKEN", "TPCOMM_STORE_TOKEN_FILE", "TPCOMM_RANK", "TPCOMM_TEST_EXTRA"}) {
        const char* v = std::getenv(var);
        out << var << "=" << (v != nullptr ? v : "<unset>") << "\n";
      }
    }
    std::rename(tmp.c_str(), (arg + rank).c_str());
  } else {
    std::fprintf(stderr, "fake_rank: unknown step \"%s\"\n", step.c_str());
    return 98;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fake_rank STEPS [STEPS...]\n");
    return 2;
  }
  const char* rank_env = std::getenv("RANK");
  const std::string rank = rank_env != nullptr ? rank_env : "0";
  const int r = std::atoi(rank.c_str());
  const std::string steps = argv[r + 1 < argc ? r + 1 : argc - 1];
  std::size_t begin = 0;
  while (begin <= steps.size()) {
    const auto end = steps.find(',', begin);
    const std::string step = steps.substr(begin, end == std::string::npos ? end : end - begin);
    if (!step.empty()) {
      if (int rc = run_step(step, rank); rc != 0) return rc;
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return 0;
}
