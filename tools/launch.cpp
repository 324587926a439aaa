// SPDX-License-Identifier: Apache-2.0
// `tpcomm launch -n N [--timeout SECONDS] -- PROGRAM ARGS...`: N local ranks of one program.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/launcher.hpp"
#include "tools/commands.hpp"

namespace tpcomm::tools {
namespace {

struct LaunchArgs {
  int nprocs = 1;
  double timeout_s = 0;
  double grace_s = 3;
  std::vector<std::string> command;
};

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds{static_cast<std::int64_t>(std::llround(seconds * 1000.0))};
}

int run_launch(const LaunchArgs& args) {
  LaunchSpec spec;
  spec.argv = args.command;
  spec.nprocs = args.nprocs;
  spec.timeout = to_ms(args.timeout_s);
  spec.grace = to_ms(args.grace_s);
  LaunchResult result = launch_local(spec);
  if (result.exit_code != 0) {
    std::fprintf(stderr, "tpcomm launch: %s\n", result.message.c_str());
    for (const RankExit& r : result.ranks) {
      if (r.how == RankExit::How::kExited && r.code == 0) continue;
      std::fprintf(stderr, "tpcomm launch:   %s%s\n", describe(r).c_str(),
                   r.stopped_by_launcher ? " (stopped by the launcher)" : "");
    }
  }
  return result.exit_code;
}

}  // namespace

void add_launch_command(CLI::App& app, Command& run) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start N ranks of PROGRAM on this machine with torchrun's variables (RANK, WORLD_SIZE, "
      "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). When one rank fails the others "
      "are stopped. Exit code: 0 when all succeed, 77 when all exit 0 or 77 (skipped), else the "
      "failing rank's code (128 + signal; 124 when the timeout passes).");
  sub->add_option("-n,--nprocs", args->nprocs, "number of ranks")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("--timeout", args->timeout_s,
                  "seconds the whole job may run before every rank is stopped (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--grace", args->grace_s,
                  "seconds between SIGTERM and SIGKILL when ranks are stopped")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("command", args->command, "PROGRAM ARGS... (put -- before PROGRAM)")->required();
  sub->callback([&run, args] { run = [args] { return run_launch(*args); }; });
}

}  // namespace tpcomm::tools
