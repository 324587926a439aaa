// SPDX-License-Identifier: Apache-2.0
// `tpcomm policy`: what the startup rules of include/tpcomm/policy.hpp decide for a job
// described by options (model architecture, GPU, sizes, flags). Pure: reads no GPU. Options
// that describe the same fact (--tp, --dp-attention) feed every rule that reads it.
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
  /// Its tp_size and enable_dp_attention come from `fusion` (see `lm_head_inputs`).
  LmHeadA2aInputs lm_head;
  bool json = false;
};

/// Parses auto|on|off exactly as `to_string(Switch)` spells them.
Switch parse_switch_option(const std::string& flag, const std::string& value) {
  for (Switch s : {Switch::kAuto, Switch::kOn, Switch::kOff})
    if (value == to_string(s)) return s;
  throw CLI::ValidationError(flag, "expected auto, on or off, got " + value);
}

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
  cmd.add_flag("--deterministic-group", in.deterministic_group,
               "the tpcomm group is deterministic (TPCOMM_DETERMINISTIC=1 or strict): its fused "
               "kernels are batch-invariant, so deterministic inference keeps the fusion");
  cmd.add_option_function<std::string>(
         "--fusion",
         [&in](const std::string& value) { in.fusion = parse_switch_option("--fusion", value); },
         "the user's setting for the fused all-reduce + residual + RMSNorm: auto (the rule "
         "decides), on, off")
      ->default_str("auto");
}

// The LM-head rule's own options; --tp and --dp-attention are the fusion rule's.
void add_lm_head_options(CLI::App& cmd, LmHeadA2aInputs& in) {
  cmd.add_option_function<std::string>(
         "--disaggregation",
         [&in](const std::string& value) {
           for (DisaggregationMode m : {DisaggregationMode::kNull, DisaggregationMode::kPrefill,
                                        DisaggregationMode::kDecode}) {
             if (value == to_string(m)) {
               in.disaggregation_mode = m;
               return;
             }
           }
           throw CLI::ValidationError("--disaggregation",
                                      "expected null, prefill or decode, got " + value);
         },
         "this server's role in prefill/decode disaggregation: null (colocated), prefill, "
         "decode")
      ->default_str("null");
  cmd.add_option("--dp", in.dp_size, "data-parallel attention size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--attn-cp", in.attn_cp_size, "context-parallel size of attention")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd.add_flag("--dp-lm-head", in.enable_dp_lm_head, "the DP LM head is on");
  cmd.add_option_function<std::string>(
         "--lm-head-a2a",
         [&in](const std::string& value) {
           in.lm_head_a2a = parse_switch_option("--lm-head-a2a", value);
         },
         "the user's setting for the LM head's all-to-all: auto (the rule decides), on, off")
      ->default_str("auto");
}

LmHeadA2aInputs lm_head_inputs(const PolicyArgs& args) {
  LmHeadA2aInputs in = args.lm_head;
  in.tp_size = args.fusion.tp_size;
  in.enable_dp_attention = args.fusion.enable_dp_attention;
  return in;
}

json lm_head_inputs_json(const LmHeadA2aInputs& in) {
  return json{{"disaggregation_mode", std::string(to_string(in.disaggregation_mode))},
              {"enable_dp_attention", in.enable_dp_attention},
              {"dp_size", in.dp_size},
              {"tp_size", in.tp_size},
              {"attn_cp_size", in.attn_cp_size},
              {"enable_dp_lm_head", in.enable_dp_lm_head},
              {"lm_head_a2a", std::string(to_string(in.lm_head_a2a))}};
}

json fusion_inputs_json(const FusionInputs& in) {
  return json{{"architecture", in.architecture},
              {"sm", in.sm},
              {"tp_size", in.tp_size},
              {"enable_dp_attention", in.enable_dp_attention},
              {"nnodes", in.nnodes},
              {"moe_a2a_backend", in.moe_a2a_backend},
              {"deterministic_inference", in.deterministic_inference},
              {"deterministic_group", in.deterministic_group},
              {"fusion", std::string(to_string(in.fusion))}};
}

int run_policy(const PolicyArgs& args) {
  const FusionDecision fusion = decide_allreduce_fusion(args.fusion);
  const LmHeadA2aInputs lm_in = lm_head_inputs(args);
  const LmHeadA2aDecision lm_head = decide_lm_head_a2a(lm_in);
  if (args.json) {
    json out;
    out["allreduce_fusion"] = {{"enabled", fusion.enabled},
                               {"backend", std::string(to_string(fusion.backend))},
                               {"reason", fusion.reason},
                               {"inputs", fusion_inputs_json(args.fusion)}};
    out["lm_head_a2a"] = {{"enabled", lm_head.enabled},
                          {"reason", lm_head.reason},
                          {"inputs", lm_head_inputs_json(lm_in)}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  const FusionInputs& in = args.fusion;
  std::printf("all-reduce + residual + RMSNorm fusion: %s", fusion.enabled ? "on" : "off");
  if (fusion.enabled) std::printf(" (backend %s)", std::string(to_string(fusion.backend)).c_str());
  std::printf("\n  reason: %s\n", fusion.reason.c_str());
  std::printf(
      "  inputs: arch %s, sm %d, tp %d, dp-attention %s, nnodes %d, moe-a2a %s, "
      "deterministic %s, deterministic group %s, fusion %s\n",
      in.architecture.empty() ? "(none)" : in.architecture.c_str(), in.sm, in.tp_size,
      in.enable_dp_attention ? "on" : "off", in.nnodes, in.moe_a2a_backend.c_str(),
      in.deterministic_inference ? "on" : "off", in.deterministic_group ? "on" : "off",
      std::string(to_string(in.fusion)).c_str());
  std::printf("LM-head all-to-all: %s\n", lm_head.enabled ? "on" : "off");
  std::printf("  reason: %s\n", lm_head.reason.c_str());
  std::printf(
      "  inputs: disaggregation %s, dp-attention %s, dp %d, tp %d, attn-cp %d, dp-lm-head %s, "
      "lm-head-a2a %s\n",
      std::string(to_string(lm_in.disaggregation_mode)).c_str(),
      lm_in.enable_dp_attention ? "on" : "off", lm_in.dp_size, lm_in.tp_size, lm_in.attn_cp_size,
      lm_in.enable_dp_lm_head ? "on" : "off", std::string(to_string(lm_in.lm_head_a2a)).c_str());
  return 0;
}

}  // namespace

void add_policy_command(CLI::App& app, Command& run) {
  auto args = std::make_shared<PolicyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "policy",
      "Decide, as SGLang does at startup, whether to turn on the fused all-reduce + residual + "
      "RMSNorm and the LM head's all-to-all for the job the options describe, and say why");
  add_fusion_options(*cmd, args->fusion);
  add_lm_head_options(*cmd, args->lm_head);
  cmd->add_flag("--json", args->json, "Print the decisions and their inputs as one JSON object");
  cmd->callback([&run, args] { run = [args] { return run_policy(*args); }; });
}

}  // namespace tpcomm::tools
