// SPDX-License-Identifier: Apache-2.0
// `tpcomm policy`: what the startup rules of include/tpcomm/policy.hpp decide for a job
// described by options (model architecture, GPU, sizes, flags). Pure: reads no GPU.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tools/commands.hpp"
#include "tpcomm/policy.hpp"

namespace tpcomm::tools {
namespace {

using nlohmann::json;

struct PolicyArgs {
  FusionInputs fusion;
  bool json = false;
};

void add_fusion_options(CLI::App& cmd, FusionInputs& in) {
  // The job a decode server on one H200 node would describe; --arch names the model.
  in.sm = 90;
  in.tp_size = 8;
  cmd.add_option("--arch", in.architecture,
                 "model architecture as its Hugging Face config names it, e.g. "
                 "DeepseekV3ForCausalLM");
  cmd.add_option("--sm", in.sm, "GPU compute capability, major * 10 + minor (90, 100, 103)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd.add_option("--tp", in.tp_size, "tensor-parallel size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_flag("--dp-attention", in.enable_dp_attention, "DP attention is on");
  cmd.add_option("--nnodes", in.nnodes, "nodes the job spans")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--moe-a2a", in.moe_a2a_backend,
                 "MoE all-to-all backend (none, deepep, mooncake, ...)")
      ->capture_default_str();
  cmd.add_flag("--deterministic", in.deterministic_inference, "deterministic inference is on");
  cmd.add_option_function<std::string>(
         "--fusion",
         [&in](const std::string& value) {
           for (Switch s : {Switch::kAuto, Switch::kOn, Switch::kOff}) {
             if (value == to_string(s)) {
               in.fusion = s;
               return;
             }
           }
           throw CLI::ValidationError("--fusion", "expected auto, on or off, got " + value);
         },
         "the user's setting for the fused all-reduce + residual + RMSNorm: auto (the rule "
         "decides), on, off")
      ->default_str("auto");
}

json fusion_inputs_json(const FusionInputs& in) {
  return json{{"architecture", in.architecture},
              {"sm", in.sm},
              {"tp_size", in.tp_size},
              {"enable_dp_attention", in.enable_dp_attention},
              {"nnodes", in.nnodes},
              {"moe_a2a_backend", in.moe_a2a_backend},
              {"deterministic_inference", in.deterministic_inference},
              {"fusion", std::string(to_string(in.fusion))}};
}

int run_policy(const PolicyArgs& args) {
  const FusionDecision fusion = decide_allreduce_fusion(args.fusion);
  if (args.json) {
    json out;
    out["allreduce_fusion"] = {{"enabled", fusion.enabled},
                               {"backend", std::string(to_string(fusion.backend))},
                               {"reason", fusion.reason},
                               {"inputs", fusion_inputs_json(args.fusion)}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const FusionInputs& in = args.fusion;
  std::printf("all-reduce + residual + RMSNorm fusion: %s", fusion.enabled ? "on" : "off");
  if (fusion.enabled) std::printf(" (backend %s)", std::string(to_string(fusion.backend)).c_str());
  std::printf("\n  reason: %s\n", fusion.reason.c_str());
  std::printf(
      "  inputs: arch %s, sm %d, tp %d, dp-attention %s, nnodes %d, moe-a2a %s, "
      "deterministic %s, fusion %s\n",
      in.architecture.empty() ? "(none)" : in.architecture.c_str(), in.sm, in.tp_size,
      in.enable_dp_attention ? "on" : "off", in.nnodes, in.moe_a2a_backend.c_str(),
      in.deterministic_inference ? "on" : "off", std::string(to_string(in.fusion)).c_str());
  return 0;
}

}  // namespace

void add_policy_command(CLI::App& app, Command& run) {
  auto args = std::make_shared<PolicyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "policy",
      "Decide, as SGLang does at startup, whether to turn on the fused all-reduce + residual + "
      "RMSNorm for the job the options describe, and say why");
  add_fusion_options(*cmd, args->fusion);
  cmd->add_flag("--json", args->json, "Print the decision and its inputs as one JSON object");
  cmd->callback([&run, args] { run = [args] { return run_policy(*args); }; });
}

}  // namespace tpcomm::tools
