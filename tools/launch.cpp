// SPDX-License-Identifier: Apache-2.0
// `tpcomm launch -n N [--timeout SECONDS] -- PROGRAM ARGS...`: N local ranks of one program.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/launcher.hpp"
#include "core/parse.hpp"
#include "tools/commands.hpp"

namespace tpcomm::tools {
namespace {

struct LaunchArgs {
  int nprocs = 1;
  double timeout_s = 0;
  double grace_s = 3;
  std::vector<std::string> command;
};

// The longest --timeout and --grace: 30 days, far inside what a millisecond count and the
// steady clock hold.
constexpr double kMaxSeconds = 30.0 * 24 * 3600;

// -n: a whole number from 1 to kMaxLocalRanks, checked on the text so that every bad value
// gets the same message, with the range in words.
CLI::Validator rank_count_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto n = parse_int(s);
        if (!n || *n < 1 || *n > kMaxLocalRanks)
          return "the number of ranks must be a whole number from 1 to " +
                 std::to_string(kMaxLocalRanks) + ", not " + s;
        return {};
      },
      "N");
}

// --timeout, --grace: 0 or from 1 ms to kMaxSeconds. A value below 1 ms is refused rather than
// rounded to 0, which would mean "no limit" for --timeout.
CLI::Validator seconds_validator(const char* zero) {
  return CLI::Validator(
      [zero](std::string& s) -> std::string {
        const std::string range = std::string(zero) + " or from 0.001 to " +
                                  std::to_string(static_cast<long>(kMaxSeconds)) + " seconds";
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || std::isnan(v))
          return s + " is not a number; use " + range;
        if (v > kMaxSeconds) return s + " is too large; use " + range;
        if (v < 0 || (v > 0 && v < 0.001)) return s + " is out of range; use " + range;
        return {};
      },
      "SECONDS");
}

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
  sub->add_option("-n,--nprocs", args->nprocs,
                  "number of ranks, from 1 to " + std::to_string(kMaxLocalRanks))
      ->required()
      ->check(rank_count_validator());
  sub->add_option("--timeout", args->timeout_s,
                  "seconds the whole job may run before every rank is stopped (0: no limit; "
                  "else from 0.001 to 2592000, 30 days)")
      ->check(seconds_validator("0 (no limit)"));
  sub->add_option("--grace", args->grace_s,
                  "seconds between SIGTERM and SIGKILL when ranks are stopped (0, or from 0.001 "
                  "to 2592000)")
      ->check(seconds_validator("0"));
  sub->add_option("command", args->command, "PROGRAM ARGS... (put -- before PROGRAM)")->required();
  sub->callback([&run, args] { run = [args] { return run_launch(*args); }; });
}

}  // namespace tpcomm::tools
