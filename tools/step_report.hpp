// SPDX-License-Identifier: Apache-2.0
// What `tpcomm step` compares and reports: the variants, the parts of a step timed alone, one
// variant's results, the printed table and JSON report, and the plot.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/step_args.hpp"
#include "tools/step_plan.hpp"

namespace tpcomm::tools {

/// The ways of serving a step that are compared.
enum class Variant : std::uint8_t {
  /// tpcomm's chosen paths: the fused all-reduce + residual add + RMSNorm, the LM head's exchange.
  kTpcomm,
  /// tpcomm unfused: the group's all-reduce then `add_rmsnorm`; the LM head by all-gather + copy.
  kUnfused,
  /// NCCL only: NCCL's all-reduce then `add_rmsnorm`; NCCL's all-gather + copy for the LM head.
  kNccl,
};
constexpr std::array kVariants{Variant::kTpcomm, Variant::kUnfused, Variant::kNccl};

const char* variant_name(Variant v);

/// The parts of a step timed on their own (graphs without compute gaps).
enum class Part : std::uint8_t { kAll, kAttn, kFfn, kLmHead, kCompute };
constexpr std::array kComponents{Part::kAttn, Part::kFfn, Part::kLmHead};

const char* part_name(Part p);

/// One variant's results at one token count (rank 0's view after `agree`).
struct Result {
  bool available = false;
  std::string reason;   // why not available
  std::string failure;  // what failed
  double step_us = 0;
  std::array<double, kComponents.size()> part_us{};
  std::uint64_t wrong = 0;
  std::string fused_by, lm_head_by;
};

/// Prints the table and returns the report.
nlohmann::json report(const StepOptions& o, const ModelSpec& model,
                      const std::vector<std::array<Result, kVariants.size()>>& results,
                      double compute_us, int world, const std::string& mode, std::uint64_t seed);

/// Where the program finds its data (models/, scripts/): next to it, then its source tree.
std::vector<std::string> step_roots();

/// Draws `json` into `png` with scripts/plot.py. 0, or 1 with a message saying what is missing.
int plot(const std::string& json, const std::string& png);

}  // namespace tpcomm::tools
