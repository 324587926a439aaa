// SPDX-License-Identifier: Apache-2.0
// `tpcomm step`: its options.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tpcomm::tools {

struct StepOptions {
  /// --model: a preset's name (`models/<name>.json`) or a JSON file.
  std::string model;
  /// --tp: tensor-parallel size; the run's world size must equal it.
  int tp = 0;
  /// --tokens: tokens per rank, one configuration each.
  std::vector<std::int64_t> tokens{1, 8, 32, 128};
  /// --compute-us: microseconds of busy GPU before each operation, standing in for the GEMMs
  /// (0: none).
  double compute_us = 0;
  /// --moe-combine: tpcomm's variant runs a MoE layer's combine and its all-reduce + norm as one
  /// call (`moe_finalize_all_reduce_add_rmsnorm`; true, "fused") or launches `moe_combine` before
  /// `all_reduce_add_rmsnorm` ("separate").
  bool moe_fused = true;
  /// --fastest: also each part timed on every path the group can take, and the step with each
  /// part on its fastest (tools/step_paths.hpp).
  bool fastest = false;
  int replays = 20;        // -n: timed replays of each graph (median reported)
  int warmup = 3;          // -w: replays before the timed ones
  std::string json;        // --json FILE
  std::string plot;        // --plot FILE.png
  int gpus = 0;            // -g N: launch N processes, one per GPU
  int virtual_ranks = 0;   // --virtual-ranks N: N threads on GPU 0
  int timeout_s = 600;     // deadline of a self-launched run
  std::uint64_t seed = 0;  // --seed (0 = random)
  bool quiet = false;      // --quiet: no progress lines (they go to a terminal's stderr only)
};

/// The most `--tokens` values one run takes.
inline constexpr std::size_t kMaxStepTokenCounts = 64;

/// Adds the options to `cmd` (the `step` subcommand) and validates them after parsing; the
/// checks that involve several options run in `cmd`'s callback, which then calls `on_valid`
/// (NOTE [one callback per command] in tools/bench_args.cpp).
void add_step_options(CLI::App& cmd, StepOptions& o, std::function<void()> on_valid = {});

/// Where `--plot OUT.png` takes its data from: `--json`, else OUT with `.json` for its extension.
std::string step_plot_json(const StepOptions& o);

}  // namespace tpcomm::tools
