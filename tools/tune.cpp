// SPDX-License-Identifier: Apache-2.0
// `tpcomm tune`: measure the custom all-reduce per size bucket, print and store the table.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "core/log.hpp"
#include "core/parse.hpp"
#include "tools/commands.hpp"
#include "tools/ranks.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm::tools {
namespace {

struct TuneOptions {
  RankPlan plan;
  std::string max_bytes;
  bool quiet = false;
};

int run_tune(const TuneOptions& t) {
  Options options = Options::from_env();
  if (!t.max_bytes.empty()) {
    auto b = parse_bytes(t.max_bytes);
    if (!b || *b <= 0 || *b % 16 != 0) {
      std::fprintf(stderr, "tpcomm tune: --max-bytes %s is not a positive multiple of 16\n",
                   t.max_bytes.c_str());
      return 2;
    }
    options.custom_ar_max_bytes = *b;
  }
  // Progress on a terminal: the tuner's line per size bucket (rank 0's), unless --quiet or
  // TPCOMM_LOG says otherwise.
  if (!t.quiet && isatty(STDERR_FILENO) != 0 && std::getenv("TPCOMM_LOG") == nullptr &&
      !log::enabled(LogLevel::kInfo))
    log::set_level(LogLevel::kInfo);
  return for_each_rank(t.plan, [&](Bootstrap& boot, int device) {
    Group g(boot, device, options);
    g.tune();
    if (boot.rank() != 0) return 0;
    const std::string table = g.tune_table_text();
    if (table.empty()) {
      std::printf(
          "tpcomm tune: the custom all-reduce is not available in this group (see the log); "
          "nothing to tune\n");
      return 1;
    }
    std::printf("%s", table.c_str());
    std::printf("# stored in %s\n", g.tune_file().c_str());
    return 0;
  });
}

}  // namespace

void add_tune_command(CLI::App& app, Command& run) {
  auto* cmd =
      app.add_subcommand("tune", "measure the custom all-reduce per size and store the table");
  auto t = std::make_shared<TuneOptions>();
  auto* g = cmd->add_option("-g,--ngpus", t->plan.gpus, "start this many processes, one per GPU")
                ->check(CLI::Range(2, 8));
  auto* v = cmd->add_option("--virtual-ranks", t->plan.virtual_ranks,
                            "tune for this many ranks as threads on GPU 0")
                ->check(CLI::Range(2, 8));
  g->excludes(v);
  cmd->add_option("--max-bytes", t->max_bytes,
                  "largest size to tune (default: TPCOMM_CUSTOM_AR_MAX_BYTES)");
  cmd->add_option("--timeout", t->plan.timeout_s, "seconds before a self-launched run is stopped")
      ->check(CLI::Range(1, 86400));
  cmd->add_flag("-q,--quiet", t->quiet,
                "no progress lines (on a terminal, each size bucket's choice goes to stderr)");
  cmd->final_callback([t, &run] { run = [t] { return run_tune(*t); }; });
}

}  // namespace tpcomm::tools
