// SPDX-License-Identifier: Apache-2.0
// `tpcomm step --fastest`: the paths a group can take for a step's calls, and the report of the
// step with each part on its fastest one.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tools/step_args.hpp"
#include "tools/step_report.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm::tools {

/// One way a group may serve a step's calls: a name and the options that pin it (`base` with
/// `TPCOMM_ALGO`, `TPCOMM_MOE_PROLOGUE`, `TPCOMM_EXCHANGE_ALGO` or `TPCOMM_LM_HEAD_A2A` set).
struct PathCandidate {
  std::string name;
  Options options;
};

/// "auto" (`base` itself) first, then each custom algorithm pinned (a fused call it cannot carry
/// takes the all-reduce then the local norm), the MoE combine as the Lamport kernels' prologue
/// (MoE models), the custom exchange's forms and the LM head by all-gather.
std::vector<PathCandidate> path_candidates(const Options& base, bool moe);

/// The step with each part on the fastest candidate found for it alone, at one token count.
struct Fastest {
  Result step;                                           // checked and timed as one graph
  std::array<std::string, kComponents.size()> path;      // each part's candidate
  std::array<double, kComponents.size()> part_us{};      // its time alone
  std::array<double, kComponents.size()> built_in_us{};  // "auto"'s, in the same rounds
};

/// The group that serves each part of a step (`kComponents`' order); null: none (the gaps).
using PartGroups = std::array<Group*, kComponents.size()>;

/// What `find_fastest` needs of the step's runner (tools/step.cpp). Collective, every call.
class StepParts {
 public:
  virtual ~StepParts() = default;
  /// A group with `options`, ready for the step's calls. Throws `Error`.
  virtual std::unique_ptr<Group> make_group(const Options& options) = 0;
  /// `part` of the step at `tokens` alone on `g`, timed (us, averaged over ranks); `failure`
  /// set on any rank's failure.
  virtual double time_part(Group& g, std::int64_t tokens, Part part, std::string& failure) = 0;
  /// The whole step at `tokens`, each part on its group: checked and timed into `r`.
  virtual void measure(const PartGroups& groups, std::int64_t tokens, Result& r) = 0;
  /// This rank prints.
  [[nodiscard]] virtual bool lead() const = 0;
};

/// `tpcomm step --fastest`: each part of the step alone on every candidate, then at each token
/// count the step with each part on its fastest candidate's group, together in one graph,
/// checked and timed, into `out` (one per `o.tokens`). False after a failure, which it prints.
bool find_fastest(StepParts& runner, const std::vector<PathCandidate>& candidates,
                  const StepOptions& o, const std::string& model, std::vector<Fastest>& out);

/// Prints the comparison with `built_in` (the tpcomm variant's results) and returns it as JSON.
nlohmann::json report_fastest(const std::vector<std::int64_t>& tokens,
                              const std::vector<std::array<Result, kVariants.size()>>& built_in,
                              const std::vector<Fastest>& fastest);

}  // namespace tpcomm::tools
