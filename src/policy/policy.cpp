// SPDX-License-Identifier: Apache-2.0
// Startup policy rules. The fusion rule re-creates SGLang's `_flashinfer_allreduce_fusion_auto_
// enable`, `_enforce_disable_allreduce_fusion`, `_deterministic_allreduce_fusion_disable`
// (`python/sglang/srt/arg_groups/overrides.py`) and `_resolve_backend`
// (`python/sglang/srt/layers/flashinfer_comm_fusion.py`); the LM-head rule re-creates
// `_tp_lm_head_all_to_all_default` and the assertions after it (`overrides.py`, SGLang PR
// #32313). Both are restated in include/tpcomm/policy.hpp.
#include "tpcomm/policy.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "core/check.hpp"

namespace tpcomm {
namespace {

// SGLang's allow-list: the models whose layers implement the fused all-reduce + residual +
// RMSNorm. Matched against `architectures[0]` of the model's Hugging Face config.
constexpr std::array<std::string_view, 16> kFusionArchitectures = {
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "GptOssForCausalLM",
    "GlmMoeDsaForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "MistralLarge3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
    "KimiK25ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM",
};

// SGLang tests the major version only (`is_sm90_supported`, `is_sm100_supported`), so SM103
// counts as SM10x and SM120 (major 12) as neither.
bool is_sm90(int sm) { return sm / 10 == 9; }
bool is_sm10x(int sm) { return sm / 10 == 10; }

std::string sm_name(int sm) { return sm == 0 ? "an unknown GPU" : "SM" + std::to_string(sm); }

std::string nodes_text(int nnodes) {
  return nnodes == 1 ? "one node" : std::to_string(nnodes) + " nodes";
}

void check_inputs(const FusionInputs& in) {
  TPCOMM_CHECK(in.tp_size >= 1, Status::kInvalidArgument, "decide_allreduce_fusion: tp_size ",
               in.tp_size, " must be at least 1");
  TPCOMM_CHECK(in.nnodes >= 1, Status::kInvalidArgument, "decide_allreduce_fusion: nnodes ",
               in.nnodes, " must be at least 1");
  TPCOMM_CHECK(in.sm >= 0, Status::kInvalidArgument, "decide_allreduce_fusion: sm ", in.sm,
               " must be major * 10 + minor (e.g. 90), or 0 for unknown");
}

/// SGLang's `_resolve_backend` for a fusion that is on. Under kAuto the auto-enable
/// conditions already exclude both refusals, so only kOn can reach them.
FusionBackend resolve_backend(const FusionInputs& in) {
  TPCOMM_CHECK(is_sm90(in.sm) || is_sm10x(in.sm), Status::kInvalidArgument,
               "all-reduce fusion is forced on, but ", sm_name(in.sm),
               " has no fused all-reduce backend: it needs SM90 or SM10x");
  if (is_sm10x(in.sm)) return FusionBackend::kMnnvl;
  TPCOMM_CHECK(in.nnodes == 1, Status::kInvalidArgument, "all-reduce fusion is forced on across ",
               in.nnodes, " nodes, but ", sm_name(in.sm),
               " has no multi-node fused all-reduce backend: it needs SM10x");
  return FusionBackend::kTrtllm;
}

FusionDecision off(std::string reason) {
  return FusionDecision{false, FusionBackend::kNone, std::move(reason)};
}

FusionDecision on(const FusionInputs& in, std::string reason) {
  const FusionBackend backend = resolve_backend(in);
  return FusionDecision{true, backend, std::move(reason)};
}

// Checks every rule makes, whatever the user's switch: a size below 1 describes no job.
void check_lm_head_inputs(const LmHeadA2aInputs& in) {
  TPCOMM_CHECK(in.dp_size >= 1, Status::kInvalidArgument, "decide_lm_head_a2a: dp_size ",
               in.dp_size, " must be at least 1");
  TPCOMM_CHECK(in.tp_size >= 1, Status::kInvalidArgument, "decide_lm_head_a2a: tp_size ",
               in.tp_size, " must be at least 1");
  TPCOMM_CHECK(in.attn_cp_size >= 1, Status::kInvalidArgument, "decide_lm_head_a2a: attn_cp_size ",
               in.attn_cp_size, " must be at least 1");
}

// SGLang asserts these once the all-to-all is on; the automatic rule only turns it on when they
// hold, so only kOn can fail them. Without them the exchange has no meaning: each rank must be
// exactly one DP rank holding one vocabulary shard.
void check_lm_head_forced_on(const LmHeadA2aInputs& in) {
  constexpr std::string_view kForced = "the LM-head all-to-all is forced on, but it needs ";
  TPCOMM_CHECK(in.enable_dp_attention, Status::kInvalidArgument, kForced,
               "DP attention (enable_dp_attention is false)");
  TPCOMM_CHECK(!in.enable_dp_lm_head, Status::kInvalidArgument, kForced,
               "the DP LM head off (enable_dp_lm_head is true)");
  TPCOMM_CHECK(in.tp_size == in.dp_size, Status::kInvalidArgument, kForced,
               "tp_size == dp_size (tp ", in.tp_size, ", dp ", in.dp_size, ")");
  TPCOMM_CHECK(in.attn_cp_size == 1, Status::kInvalidArgument, kForced,
               "attn_cp_size == 1 (attn_cp ", in.attn_cp_size, ")");
}

LmHeadA2aDecision lm_head_off(std::string reason) {
  return LmHeadA2aDecision{false, std::move(reason)};
}

}  // namespace

std::string_view to_string(DisaggregationMode m) noexcept {
  switch (m) {
    case DisaggregationMode::kNull:
      return "null";
    case DisaggregationMode::kPrefill:
      return "prefill";
    case DisaggregationMode::kDecode:
      return "decode";
  }
  return "unknown";
}

std::string_view to_string(FusionBackend b) noexcept {
  switch (b) {
    case FusionBackend::kNone:
      return "none";
    case FusionBackend::kTrtllm:
      return "trtllm";
    case FusionBackend::kMnnvl:
      return "mnnvl";
  }
  return "unknown";
}

std::span<const std::string_view> allreduce_fusion_architectures() noexcept {
  return kFusionArchitectures;
}

FusionDecision decide_allreduce_fusion(const FusionInputs& in) {
  check_inputs(in);
  // The user's switch is applied after SGLang's automatic rule there, and wins over it.
  if (in.fusion == Switch::kOff) return off("fusion forced off by the user");
  if (in.fusion == Switch::kOn) return on(in, "fusion forced on by the user");

  if (in.deterministic_inference && !in.deterministic_group)
    return off("deterministic inference turns the automatic fusion off");
  const std::string& arch = in.architecture;
  if (arch.empty()) return off("no model architecture given (auto needs one in the allow-list)");
  if (std::find(kFusionArchitectures.begin(), kFusionArchitectures.end(), arch) ==
      kFusionArchitectures.end())
    return off("architecture " + arch + " is not in the allow-list");
  if (!is_sm90(in.sm) && !is_sm10x(in.sm))
    return off(sm_name(in.sm) + " is neither SM90 nor SM10x");
  if (in.tp_size < 2)
    return off("tp_size " + std::to_string(in.tp_size) + ": nothing to all-reduce");
  if (in.enable_dp_attention) return off("DP attention is on");
  if (in.nnodes > 1 && !is_sm10x(in.sm))
    return off(nodes_text(in.nnodes) + " on " + sm_name(in.sm) + ": multi-node needs SM10x");
  if (in.moe_a2a_backend != "none")
    return off("MoE all-to-all backend " + in.moe_a2a_backend + " is not none");

  const std::string batch_invariant =
      in.deterministic_inference
          ? "deterministic inference on a deterministic group, whose fused kernels are "
            "batch-invariant, "
          : "";
  return on(in, "auto: " + batch_invariant + "architecture " + arch + " is in the allow-list, " +
                    sm_name(in.sm) + ", tp_size " + std::to_string(in.tp_size) +
                    ", no DP attention, " + nodes_text(in.nnodes) +
                    ", MoE all-to-all backend none");
}

LmHeadA2aDecision decide_lm_head_a2a(const LmHeadA2aInputs& in) {
  check_lm_head_inputs(in);
  if (in.lm_head_a2a == Switch::kOff)
    return lm_head_off("LM-head all-to-all forced off by the user");
  if (in.lm_head_a2a == Switch::kOn) {
    check_lm_head_forced_on(in);
    return LmHeadA2aDecision{true, "LM-head all-to-all forced on by the user"};
  }

  const std::string tp = std::to_string(in.tp_size);
  const std::string dp = std::to_string(in.dp_size);
  if (in.disaggregation_mode != DisaggregationMode::kDecode)
    return lm_head_off("disaggregation mode " + std::string(to_string(in.disaggregation_mode)) +
                       ": not a decode server");
  if (!in.enable_dp_attention) return lm_head_off("DP attention is off");
  if (in.dp_size < 2) return lm_head_off("dp_size 1: no DP ranks to exchange logits with");
  if (in.tp_size != in.dp_size)
    return lm_head_off("tp_size " + tp + " != dp_size " + dp + ": the exchange needs them equal");
  if (in.attn_cp_size != 1)
    return lm_head_off("attn_cp_size " + std::to_string(in.attn_cp_size) +
                       ": the exchange needs attention without context parallelism");
  if (in.enable_dp_lm_head) return lm_head_off("the DP LM head is on");

  return LmHeadA2aDecision{true, "auto: decode server, DP attention on, dp_size " + dp +
                                     ", tp_size " + tp +
                                     " == dp_size, attn_cp_size 1, DP LM head off"};
}

}  // namespace tpcomm
