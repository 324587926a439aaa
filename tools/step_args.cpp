// SPDX-License-Identifier: Apache-2.0
#include "tools/step_args.hpp"

#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

namespace tpcomm::tools {

void add_step_options(CLI::App& cmd, StepOptions& o, std::function<void()> on_valid) {
  cmd.add_option("--model", o.model,
                 "a preset's name (deepseek-v3, llama-3.1-70b, qwen3-235b-a22b, gpt-oss-120b, ...: "
                 "the files of models/) or a JSON file with the same fields")
      ->required();
  cmd.add_option("--tp", o.tp, "tensor-parallel size: the number of ranks")
      ->required()
      ->check(CLI::Range(1, 64));
  cmd.add_option("--tokens", o.tokens, "tokens per rank, comma-separated: one configuration each")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd.add_option("--compute-us", o.compute_us,
                 "busy the GPU this many microseconds before each operation, standing in for the "
                 "GEMMs (0: communication only)")
      ->check(CLI::Range(0.0, 100000.0));
  cmd.add_option_function<std::string>(
         "--moe-combine", [&o](const std::string& v) { o.moe_fused = v == "fused"; },
         "how tpcomm's variant runs a MoE layer's combine: fused (one call with the all-reduce "
         "+ norm, moe_finalize_all_reduce_add_rmsnorm, which TPCOMM_MOE_PROLOGUE serves) or "
         "separate (moe_combine, then all_reduce_add_rmsnorm); the other variants always run it "
         "separately")
      ->default_str("fused")
      ->check(CLI::IsMember({"fused", "separate"}));
  cmd.add_flag("--fastest", o.fastest,
               "also time each part of the step (attention, MLP/MoE, LM head) alone on every path "
               "the group can take (each custom algorithm pinned, the MoE prologue, the exchange's "
               "forms, the LM head by all-gather), then the step with each part on its fastest, "
               "against the built-in choice");
  cmd.add_option("-n,--replays", o.replays, "timed replays of each graph (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd.add_option("-w,--warmup", o.warmup, "replays of each graph before the timed ones")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  cmd.add_option("--json", o.json, "also write the results as JSON to this file");
  cmd.add_option("--plot", o.plot,
                 "draw the results into this PNG with scripts/plot.py (needs python3 and "
                 "matplotlib; the JSON goes to --json, else next to the PNG)");
  auto* g = cmd.add_option("-g,--ngpus", o.gpus, "start this many processes, one per GPU (= --tp)")
                ->check(CLI::Range(1, 64));
  auto* v = cmd.add_option("--virtual-ranks", o.virtual_ranks,
                           "run this many ranks as threads on GPU 0 (= --tp)")
                ->check(CLI::Range(1, 8));
  g->excludes(v);
  cmd.add_option("--timeout", o.timeout_s, "seconds before a self-launched run is stopped")
      ->check(CLI::Range(1, 86400));
  cmd.add_option("--seed", o.seed, "seed of the test data (0: random)");
  cmd.add_flag("-q,--quiet", o.quiet, "no progress lines (they go to a terminal's stderr only)");
  // NOTE [one callback per command] (tools/bench_args.cpp): the checks, then the body.
  cmd.callback([&o, on_valid = std::move(on_valid)] {
    if (o.tokens.empty()) throw CLI::ValidationError("--tokens", "give at least one token count");
    // A range check lets NaN through (every comparison with it is false).
    if (!std::isfinite(o.compute_us))
      throw CLI::ValidationError("--compute-us", "a number of microseconds from 0 to 100000");
    if (o.tokens.size() > kMaxStepTokenCounts)
      throw CLI::ValidationError(
          "--tokens", "at most " + std::to_string(kMaxStepTokenCounts) + " token counts");
    if (o.virtual_ranks > 0 && o.virtual_ranks != o.tp)
      throw CLI::ValidationError("--virtual-ranks",
                                 "runs one rank per tensor-parallel rank: give " +
                                     std::to_string(o.tp) + " (--tp), not " +
                                     std::to_string(o.virtual_ranks));
    if (o.gpus > 0 && o.gpus != o.tp)
      throw CLI::ValidationError("-g", "runs one process per tensor-parallel rank: give " +
                                           std::to_string(o.tp) + " (--tp), not " +
                                           std::to_string(o.gpus));
    if (!o.plot.empty() && step_plot_json(o) == o.plot)
      throw CLI::ValidationError("--plot", "the picture cannot be the JSON file: " + o.plot);
    if (on_valid) on_valid();
  });
}

std::string step_plot_json(const StepOptions& o) {
  if (!o.json.empty()) return o.json;
  return std::filesystem::path(o.plot).replace_extension(".json").string();
}

}  // namespace tpcomm::tools
