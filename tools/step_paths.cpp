// SPDX-License-Identifier: Apache-2.0
#include "tools/step_paths.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "tune/algorithms.hpp"

namespace tpcomm::tools {

std::vector<PathCandidate> path_candidates(const Options& base, bool moe) {
  std::vector<PathCandidate> out{{"auto", base}};
  for (const AlgoInfo& a : kAlgorithms) {
    PathCandidate c{std::string(a.name), base};
    c.options.algo = std::string(a.name);
    out.push_back(std::move(c));
  }
  if (moe) {
    PathCandidate c{"prologue", base};
    c.options.moe_prologue = Switch::kOn;
    out.push_back(std::move(c));
  }
  for (const char* form : {"pull", "push"}) {
    PathCandidate c{form, base};
    c.options.exchange_algo = form;
    out.push_back(std::move(c));
  }
  PathCandidate gather{"all_gather", base};
  gather.options.lm_head_a2a = Switch::kOff;
  out.push_back(std::move(gather));
  return out;
}

bool find_fastest(StepParts& runner, const std::vector<PathCandidate>& candidates,
                  const StepOptions& o, const std::string& model, std::vector<Fastest>& out) {
  using Times = std::array<double, kComponents.size()>;
  std::vector<std::vector<Times>> us(o.tokens.size(), std::vector<Times>(candidates.size()));
  auto failed = [&](const std::string& what, const std::string& why) {
    if (runner.lead()) std::printf("# fastest: %s: failed: %s\n", what.c_str(), why.c_str());
    return false;
  };
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    std::unique_ptr<Group> g;
    try {
      g = runner.make_group(candidates[c].options);
    } catch (const Error& e) {
      return failed(candidates[c].name, e.what());
    }
    for (std::size_t ti = 0; ti < o.tokens.size(); ++ti) {
      for (std::size_t p = 0; p < kComponents.size(); ++p) {
        std::string failure;
        us[ti][c][p] = runner.time_part(*g, o.tokens[ti], kComponents[p], failure);
        if (!failure.empty()) return failed(candidates[c].name, failure);
      }
    }
    if (runner.lead() && !o.quiet && isatty(STDERR_FILENO) != 0)
      std::fprintf(stderr, "[tpcomm step] %s, fastest paths: %s, %zu/%zu\n", model.c_str(),
                   candidates[c].name.c_str(), c + 1, candidates.size());
  }
  out.assign(o.tokens.size(), {});
  for (std::size_t ti = 0; ti < o.tokens.size(); ++ti) {
    Fastest& f = out[ti];
    std::array<std::size_t, kComponents.size()> best{};
    for (std::size_t p = 0; p < kComponents.size(); ++p) {
      for (std::size_t c = 1; c < candidates.size(); ++c)
        if (us[ti][c][p] < us[ti][best[p]][p]) best[p] = c;
      f.path[p] = candidates[best[p]].name;
      f.part_us[p] = us[ti][best[p]][p];
      f.built_in_us[p] = us[ti][0][p];
    }
    // One group per candidate chosen, the parts together in one graph.
    std::vector<std::pair<std::size_t, std::unique_ptr<Group>>> groups;
    PartGroups parts{};
    for (std::size_t p = 0; p < kComponents.size(); ++p) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& e) { return e.first == best[p]; });
      if (it == groups.end()) {
        try {
          groups.emplace_back(best[p], runner.make_group(candidates[best[p]].options));
        } catch (const Error& e) {
          return failed(candidates[best[p]].name, e.what());
        }
        it = groups.end() - 1;
      }
      parts[p] = it->second.get();
    }
    runner.measure(parts, o.tokens[ti], f.step);
    if (!f.step.failure.empty())
      return failed(std::to_string(o.tokens[ti]) + " tokens", f.step.failure);
  }
  return true;
}

nlohmann::json report_fastest(const std::vector<std::int64_t>& tokens,
                              const std::vector<std::array<Result, kVariants.size()>>& built_in,
                              const std::vector<Fastest>& fastest) {
  std::printf("# the step with each part on the fastest path found for it alone (--fastest):\n");
  std::printf("#%7s %10s %10s %7s  %s\n", "tokens", "built-in", "fastest", "ratio",
              "each part: path (us alone, built-in's us)");
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t ti = 0; ti < fastest.size() && ti < built_in.size(); ++ti) {
    const Fastest& f = fastest[ti];
    const Result& b = built_in[ti][0];
    if (!f.step.available || !b.available) {
      std::printf(" %7lld n/a: %s\n", static_cast<long long>(tokens[ti]),
                  f.step.failure.empty() ? f.step.reason.c_str() : f.step.failure.c_str());
      out.push_back({{"tokens", tokens[ti]}, {"available", false}});
      continue;
    }
    const double ratio = f.step.step_us > 0 ? b.step_us / f.step.step_us : 0;
    std::string parts;
    nlohmann::json parts_json;
    for (std::size_t c = 0; c < kComponents.size(); ++c) {
      char text[160];
      std::snprintf(text, sizeof(text), "%s%s: %s (%.1f, %.1f)", c == 0 ? "" : ", ",
                    part_name(kComponents[c]), f.path[c].c_str(), f.part_us[c], f.built_in_us[c]);
      parts += text;
      parts_json[part_name(kComponents[c])] = {
          {"path", f.path[c]}, {"us", f.part_us[c]}, {"built_in_us", f.built_in_us[c]}};
    }
    std::printf(" %7lld %10.1f %10.1f %7.3f  %s\n", static_cast<long long>(tokens[ti]), b.step_us,
                f.step.step_us, ratio, parts.c_str());
    out.push_back({{"tokens", tokens[ti]},
                   {"available", true},
                   {"built_in_step_us", b.step_us},
                   {"step_us", f.step.step_us},
                   {"built_in_over_fastest", ratio},
                   {"wrong", f.step.wrong},
                   {"parts", parts_json}});
  }
  return out;
}

}  // namespace tpcomm::tools
