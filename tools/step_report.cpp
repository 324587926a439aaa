// SPDX-License-Identifier: Apache-2.0
#include "tools/step_report.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "tpcomm/types.hpp"

#ifndef TPCOMM_SOURCE_DIR
#define TPCOMM_SOURCE_DIR ""
#endif

namespace tpcomm::tools {

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kTpcomm:
      return "tpcomm";
    case Variant::kUnfused:
      return "unfused";
    case Variant::kNccl:
      return "nccl";
  }
  return "?";
}

const char* part_name(Part p) {
  switch (p) {
    case Part::kAttn:
      return "attn_reduce";
    case Part::kFfn:
      return "mlp_reduce";
    case Part::kLmHead:
      return "lm_head";
    case Part::kAll:
      return "step";
    case Part::kCompute:
      return "compute";
  }
  return "?";
}

namespace {

/// Communication time of a step: the step less the compute gaps (measured alone).
double comm_us(const Result& r, double compute_us) { return r.step_us - compute_us; }

/// The share of variant `other`'s step that tpcomm's chosen paths save.
std::optional<double> saving(const Result& chosen, const Result& other) {
  if (!chosen.available || !other.available || other.step_us <= 0) return std::nullopt;
  return (other.step_us - chosen.step_us) / other.step_us;
}

nlohmann::json model_json(const ModelSpec& m) {
  return {{"name", m.name},
          {"source", m.source},
          {"hidden_size", m.hidden},
          {"num_layers", m.layers},
          {"vocab_size", m.vocab},
          {"dtype", to_string(m.dtype)},
          {"moe", m.moe},
          {"first_dense_layers", m.first_dense_layers},
          {"num_experts_per_tok", m.top_k},
          {"n_shared_experts", m.shared_experts}};
}

/// `s` quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

nlohmann::json report(const StepOptions& o, const ModelSpec& model,
                      const std::vector<std::array<Result, kVariants.size()>>& results,
                      double compute_us, int world, const std::string& mode, std::uint64_t seed) {
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const StepPlan first = plan_step(model, o.tp, o.tokens.front());
  const auto gaps = static_cast<std::int64_t>(first.ops.size());
  std::printf(
      "#\n# per step: %lld reductions of [tokens, %lld] (%lld attention, %lld MLP, %lld "
      "MoE) and the LM head's exchange of [tokens, %lld]\n",
      static_cast<long long>(first.ops.size() - 1), static_cast<long long>(model.hidden),
      static_cast<long long>(first.count(StepOpKind::kAttnReduce)),
      static_cast<long long>(first.count(StepOpKind::kMlpReduce)),
      static_cast<long long>(first.count(StepOpKind::kMoeReduce)),
      static_cast<long long>(model.vocab));
  if (model.moe)
    std::printf("# MoE layers: the combine of %d experts per token%s first, %s in tpcomm's paths\n",
                model.top_k, model.shared_experts > 0 ? " and the shared expert" : "",
                o.moe_fused ? "in one call with the all-reduce + norm" : "a kernel of its own");
  if (o.compute_us > 0)
    std::printf("# compute gaps: %lld x %g us before the operations, measured alone %.1f us\n",
                static_cast<long long>(gaps), o.compute_us, compute_us);
  std::printf("# CUDA graph replays: median of %d after %d warm-up; components timed alone\n",
              o.replays, o.warmup);
  std::printf("#%7s %-8s %10s %10s %10s %10s %10s %10s %10s %7s %6s  %s\n", "tokens", "variant",
              "step", "comm", "comm/layer", "comm/token", "attn", "mlp", "lm_head", "saving",
              "#wrong", "served by");
  std::printf("#%7s %-8s %10s %10s %10s %10s %10s %10s %10s %7s %6s\n", "", "", "(us)", "(us)",
              "(us)", "(us)", "(us)", "(us)", "(us)", "", "");
  nlohmann::json configs = nlohmann::json::array();
  std::uint64_t wrong = 0;
  for (std::size_t ti = 0; ti < o.tokens.size(); ++ti) {
    const std::int64_t tokens = o.tokens[ti];
    const StepPlan plan = plan_step(model, o.tp, tokens);
    const Result& chosen = results[ti][0];
    nlohmann::json variants = nlohmann::json::array();
    for (std::size_t vi = 0; vi < kVariants.size(); ++vi) {
      const Result& r = results[ti][vi];
      const char* name = variant_name(kVariants[vi]);
      if (!r.available) {
        std::printf(" %7lld %-8s n/a: %s\n", static_cast<long long>(tokens), name,
                    r.reason.c_str());
        variants.push_back({{"variant", name}, {"available", false}, {"reason", r.reason}});
        continue;
      }
      wrong += r.wrong;
      const double comm = comm_us(r, compute_us);
      const auto save = vi == 0 ? std::nullopt : saving(chosen, r);
      char save_text[16] = "-";
      if (save) std::snprintf(save_text, sizeof(save_text), "%.1f%%", *save * 100.0);
      std::printf(
          " %7lld %-8s %10.1f %10.1f %10.2f %10.2f %10.1f %10.1f %10.1f %7s %6llu  %s, %s\n",
          static_cast<long long>(tokens), name, r.step_us, comm,
          comm / static_cast<double>(model.layers), comm / static_cast<double>(tokens),
          r.part_us[0], r.part_us[1], r.part_us[2], save_text,
          static_cast<unsigned long long>(r.wrong), r.fused_by.c_str(), r.lm_head_by.c_str());
      nlohmann::json parts;
      for (std::size_t c = 0; c < kComponents.size(); ++c)
        parts[part_name(kComponents[c])] = r.part_us[c];
      variants.push_back({{"variant", name},
                          {"available", true},
                          {"step_us", r.step_us},
                          {"comm_us", comm},
                          {"comm_per_layer_us", comm / static_cast<double>(model.layers)},
                          {"comm_per_token_us", comm / static_cast<double>(tokens)},
                          {"components_us", parts},
                          {"saving_share", save ? nlohmann::json(*save) : nlohmann::json()},
                          {"wrong", r.wrong},
                          {"served_by", {{"reduction", r.fused_by}, {"lm_head", r.lm_head_by}}}});
    }
    configs.push_back({{"tokens", tokens},
                       {"operations", plan.ops.size()},
                       {"bytes_per_rank", plan.in_bytes()},
                       {"variants", variants}});
  }
  std::printf("# Out of bounds values : %llu %s\n#\n", static_cast<unsigned long long>(wrong),
              wrong == 0 ? "OK" : "FAILED");
  return {{"tool", "tpcomm step"},
          {"version", TPCOMM_VERSION},
          {"model", model_json(model)},
          {"tp", o.tp},
          {"moe_combine", model.moe ? (o.moe_fused ? "fused" : "separate") : "none"},
          {"world_size", world},
          {"mode", mode},
          {"gpu", prop.name},
          {"compute_us_per_gap", o.compute_us},
          {"gaps_per_step", o.compute_us > 0 ? gaps : 0},
          {"compute_us", compute_us},
          {"replays", o.replays},
          {"warmup", o.warmup},
          {"seed", seed},
          {"wrong", wrong},
          {"configs", configs}};
}

std::vector<std::string> step_roots() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return data_roots(ec ? std::string() : exe.parent_path().string(), TPCOMM_SOURCE_DIR);
}

int plot(const std::string& json, const std::string& png) {
  std::string script;
  for (const std::string& r : step_roots()) {
    const auto p = std::filesystem::path(r) / "scripts" / "plot.py";
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) {
      script = p.string();
      break;
    }
  }
  if (script.empty()) {
    std::fprintf(stderr,
                 "tpcomm step: --plot: scripts/plot.py not found next to the program or "
                 "in its source tree\n");
    return 1;
  }
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    std::fprintf(stderr,
                 "tpcomm step: --plot needs python3 with matplotlib (Debian/Ubuntu: apt-get "
                 "install python3-matplotlib; elsewhere: python3 -m pip install matplotlib); the "
                 "results are in %s: draw them later with python3 %s %s -o %s\n",
                 json.c_str(), script.c_str(), json.c_str(), png.c_str());
    return 1;
  }
  const std::string cmd =
      "python3 " + shell_quote(script) + " " + shell_quote(json) + " -o " + shell_quote(png);
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "tpcomm step: --plot: %s failed\n", cmd.c_str());
    return 1;
  }
  std::printf("# plot: %s\n", png.c_str());
  return 0;
}

}  // namespace tpcomm::tools
