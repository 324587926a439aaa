// SPDX-License-Identifier: Apache-2.0
// The startup rules of tpcomm/policy.hpp, and `tpcomm policy`, which prints them.
#include "tpcomm/policy.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_program.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {
namespace {

/// A job for which every automatic condition holds: DeepSeek-V3 on one H200 node, tp 8.
FusionInputs eligible() {
  FusionInputs in;
  in.architecture = "DeepseekV3ForCausalLM";
  in.sm = 90;
  in.tp_size = 8;
  in.nnodes = 1;
  return in;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(AllReduceFusionPolicy, AutoEnablesAnEligibleJob) {
  const FusionDecision d = decide_allreduce_fusion(eligible());
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.backend, FusionBackend::kTrtllm);
  EXPECT_TRUE(contains(d.reason, "auto")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "DeepseekV3ForCausalLM")) << d.reason;
}

TEST(AllReduceFusionPolicy, AllowListIsSglangs) {
  const std::vector<std::string> want = {
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
  std::vector<std::string> got;
  for (std::string_view a : allreduce_fusion_architectures()) got.emplace_back(a);
  EXPECT_EQ(got, want);
  for (const std::string& arch : want) {
    FusionInputs in = eligible();
    in.architecture = arch;
    EXPECT_TRUE(decide_allreduce_fusion(in).enabled) << arch;
  }
}

// Each automatic condition, broken alone on an eligible job, turns the fusion off, and the
// reason names it.
TEST(AllReduceFusionPolicy, EveryAutoConditionDecides) {
  struct Flip {
    const char* what;
    void (*change)(FusionInputs&);
    const char* reason;
  };
  const std::vector<Flip> flips = {
      {"architecture not allowed", [](FusionInputs& in) { in.architecture = "LlamaForCausalLM"; },
       "architecture LlamaForCausalLM is not in the allow-list"},
      {"short name is not the architecture",
       [](FusionInputs& in) { in.architecture = "DeepseekV3"; },
       "architecture DeepseekV3 is not in the allow-list"},
      {"names are case-sensitive",
       [](FusionInputs& in) { in.architecture = "deepseekv3forcausallm"; },
       "is not in the allow-list"},
      {"no architecture", [](FusionInputs& in) { in.architecture.clear(); },
       "no model architecture given"},
      {"SM80", [](FusionInputs& in) { in.sm = 80; }, "SM80 is neither SM90 nor SM10x"},
      {"SM89", [](FusionInputs& in) { in.sm = 89; }, "SM89 is neither SM90 nor SM10x"},
      {"SM120 is not SM10x", [](FusionInputs& in) { in.sm = 120; },
       "SM120 is neither SM90 nor SM10x"},
      {"unknown GPU", [](FusionInputs& in) { in.sm = 0; }, "an unknown GPU is neither"},
      {"tp 1", [](FusionInputs& in) { in.tp_size = 1; }, "tp_size 1: nothing to all-reduce"},
      {"DP attention", [](FusionInputs& in) { in.enable_dp_attention = true; },
       "DP attention is on"},
      {"two SM90 nodes", [](FusionInputs& in) { in.nnodes = 2; },
       "2 nodes on SM90: multi-node needs SM10x"},
      {"MoE all-to-all backend", [](FusionInputs& in) { in.moe_a2a_backend = "deepep"; },
       "MoE all-to-all backend deepep is not none"},
      {"deterministic inference", [](FusionInputs& in) { in.deterministic_inference = true; },
       "deterministic inference turns the automatic fusion off"},
  };
  for (const Flip& f : flips) {
    SCOPED_TRACE(f.what);
    FusionInputs in = eligible();
    f.change(in);
    const FusionDecision d = decide_allreduce_fusion(in);
    EXPECT_FALSE(d.enabled);
    EXPECT_EQ(d.backend, FusionBackend::kNone);
    EXPECT_TRUE(contains(d.reason, f.reason)) << d.reason;
  }
}

TEST(AllReduceFusionPolicy, BlackwellResolvesToMnnvlOnOneNodeOrSeveral) {
  for (int sm : {100, 103}) {
    for (int nnodes : {1, 2, 4}) {
      SCOPED_TRACE("sm " + std::to_string(sm) + ", nnodes " + std::to_string(nnodes));
      FusionInputs in = eligible();
      in.sm = sm;
      in.nnodes = nnodes;
      const FusionDecision d = decide_allreduce_fusion(in);
      EXPECT_TRUE(d.enabled) << d.reason;
      EXPECT_EQ(d.backend, FusionBackend::kMnnvl);
    }
  }
  // The same check breaks a Blackwell job as a Hopper one.
  FusionInputs in = eligible();
  in.sm = 100;
  in.moe_a2a_backend = "mooncake";
  EXPECT_FALSE(decide_allreduce_fusion(in).enabled);
}

TEST(AllReduceFusionPolicy, ExplicitOffWins) {
  FusionInputs in = eligible();
  in.fusion = Switch::kOff;
  const FusionDecision d = decide_allreduce_fusion(in);
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(d.backend, FusionBackend::kNone);
  EXPECT_EQ(d.reason, "fusion forced off by the user");
}

// kOn wins over every automatic condition, deterministic inference included.
TEST(AllReduceFusionPolicy, ExplicitOnWins) {
  const std::vector<void (*)(FusionInputs&)> changes = {
      [](FusionInputs&) {},
      [](FusionInputs& in) { in.architecture = "LlamaForCausalLM"; },
      [](FusionInputs& in) { in.architecture.clear(); },
      [](FusionInputs& in) { in.tp_size = 1; },
      [](FusionInputs& in) { in.enable_dp_attention = true; },
      [](FusionInputs& in) { in.moe_a2a_backend = "deepep"; },
      [](FusionInputs& in) { in.deterministic_inference = true; },
  };
  for (std::size_t i = 0; i < changes.size(); ++i) {
    SCOPED_TRACE("change " + std::to_string(i));
    FusionInputs in = eligible();
    in.fusion = Switch::kOn;
    changes[i](in);
    const FusionDecision d = decide_allreduce_fusion(in);
    EXPECT_TRUE(d.enabled);
    EXPECT_EQ(d.backend, FusionBackend::kTrtllm);
    EXPECT_EQ(d.reason, "fusion forced on by the user");
  }
  FusionInputs in = eligible();
  in.fusion = Switch::kOn;
  in.sm = 100;
  in.nnodes = 2;
  EXPECT_EQ(decide_allreduce_fusion(in).backend, FusionBackend::kMnnvl);
}

// Deterministic inference turns the automatic fusion off unless the group is deterministic,
// whose fused kernels are batch-invariant (the reason says so).
TEST(AllReduceFusionPolicy, DeterministicGroupKeepsTheFusionUnderDeterministicInference) {
  FusionInputs in = eligible();
  in.deterministic_inference = true;
  EXPECT_FALSE(decide_allreduce_fusion(in).enabled);
  in.deterministic_group = true;
  const FusionDecision d = decide_allreduce_fusion(in);
  EXPECT_TRUE(d.enabled) << d.reason;
  EXPECT_EQ(d.backend, FusionBackend::kTrtllm);
  EXPECT_TRUE(contains(d.reason, "deterministic group, whose fused kernels are batch-invariant"))
      << d.reason;
}

// Forced on where no backend exists: SGLang refuses to start, and so does the rule.
TEST(AllReduceFusionPolicy, ExplicitOnWithoutABackendIsAnError) {
  struct Bad {
    int sm;
    int nnodes;
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{{80, 1, "SM80 has no fused all-reduce backend"},
                                       {120, 1, "SM120 has no fused all-reduce backend"},
                                       {0, 1, "an unknown GPU has no fused all-reduce backend"},
                                       {90, 2, "across 2 nodes, but SM90 has no multi-node"}}) {
    SCOPED_TRACE(b.message);
    FusionInputs in = eligible();
    in.fusion = Switch::kOn;
    in.sm = b.sm;
    in.nnodes = b.nnodes;
    try {
      (void)decide_allreduce_fusion(in);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_TRUE(contains(e.what(), b.message)) << e.what();
    }
    // Off needs no backend.
    in.fusion = Switch::kOff;
    EXPECT_FALSE(decide_allreduce_fusion(in).enabled);
  }
}

TEST(AllReduceFusionPolicy, OutOfRangeInputsAreErrors) {
  struct Bad {
    void (*change)(FusionInputs&);
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {[](FusionInputs& in) { in.tp_size = 0; }, "tp_size 0 must be at least 1"},
           {[](FusionInputs& in) { in.nnodes = 0; }, "nnodes 0 must be at least 1"},
           {[](FusionInputs& in) { in.sm = -90; }, "sm -90 must be"},
       }) {
    SCOPED_TRACE(b.message);
    FusionInputs in = eligible();
    b.change(in);
    for (Switch s : {Switch::kAuto, Switch::kOn, Switch::kOff}) {
      in.fusion = s;
      try {
        (void)decide_allreduce_fusion(in);
        ADD_FAILURE() << "accepted under " << to_string(s);
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::kInvalidArgument);
        EXPECT_TRUE(contains(e.what(), b.message)) << e.what();
      }
    }
  }
}

TEST(AllReduceFusionPolicy, Names) {
  EXPECT_EQ(to_string(Switch::kAuto), "auto");
  EXPECT_EQ(to_string(Switch::kOn), "on");
  EXPECT_EQ(to_string(Switch::kOff), "off");
  EXPECT_EQ(to_string(FusionBackend::kNone), "none");
  EXPECT_EQ(to_string(FusionBackend::kTrtllm), "trtllm");
  EXPECT_EQ(to_string(FusionBackend::kMnnvl), "mnnvl");
}

// ---------------------------------------------------------------------------------------------
// LM-head all-to-all

/// A job for which every automatic condition holds: a decode server, DP attention, tp = dp = 8.
LmHeadA2aInputs decode_server() {
  LmHeadA2aInputs in;
  in.disaggregation_mode = DisaggregationMode::kDecode;
  in.enable_dp_attention = true;
  in.dp_size = 8;
  in.tp_size = 8;
  in.attn_cp_size = 1;
  in.enable_dp_lm_head = false;
  return in;
}

TEST(LmHeadA2aPolicy, AutoEnablesADecodeServerWithPureDpAttention) {
  const LmHeadA2aDecision d = decide_lm_head_a2a(decode_server());
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.reason,
            "auto: decode server, DP attention on, dp_size 8, tp_size 8 == dp_size, "
            "attn_cp_size 1, DP LM head off");
  LmHeadA2aInputs in = decode_server();
  in.dp_size = 2;
  in.tp_size = 2;
  EXPECT_TRUE(decide_lm_head_a2a(in).enabled);
}

TEST(LmHeadA2aPolicy, DefaultsDescribeAColocatedServer) {
  const LmHeadA2aDecision d = decide_lm_head_a2a(LmHeadA2aInputs{});
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(d.reason, "disaggregation mode null: not a decode server");
}

// Each automatic condition, broken alone on an eligible job, turns the all-to-all off, and the
// reason names it.
TEST(LmHeadA2aPolicy, EveryAutoConditionDecides) {
  struct Flip {
    const char* what;
    void (*change)(LmHeadA2aInputs&);
    const char* reason;
  };
  const std::vector<Flip> flips = {
      {"prefill server",
       [](LmHeadA2aInputs& in) { in.disaggregation_mode = DisaggregationMode::kPrefill; },
       "disaggregation mode prefill: not a decode server"},
      {"colocated server",
       [](LmHeadA2aInputs& in) { in.disaggregation_mode = DisaggregationMode::kNull; },
       "disaggregation mode null: not a decode server"},
      {"no DP attention", [](LmHeadA2aInputs& in) { in.enable_dp_attention = false; },
       "DP attention is off"},
      {"dp 1",
       [](LmHeadA2aInputs& in) {
         in.dp_size = 1;
         in.tp_size = 1;
       },
       "dp_size 1: no DP ranks to exchange logits with"},
      {"tp above dp", [](LmHeadA2aInputs& in) { in.dp_size = 4; },
       "tp_size 8 != dp_size 4: the exchange needs them equal"},
      {"tp below dp", [](LmHeadA2aInputs& in) { in.tp_size = 4; },
       "tp_size 4 != dp_size 8: the exchange needs them equal"},
      {"attention CP", [](LmHeadA2aInputs& in) { in.attn_cp_size = 2; },
       "attn_cp_size 2: the exchange needs attention without context parallelism"},
      {"DP LM head", [](LmHeadA2aInputs& in) { in.enable_dp_lm_head = true; },
       "the DP LM head is on"},
  };
  for (const Flip& f : flips) {
    SCOPED_TRACE(f.what);
    LmHeadA2aInputs in = decode_server();
    f.change(in);
    const LmHeadA2aDecision d = decide_lm_head_a2a(in);
    EXPECT_FALSE(d.enabled);
    EXPECT_EQ(d.reason, f.reason);
  }
}

// With several conditions failing, the reason names the first in SGLang's order.
TEST(LmHeadA2aPolicy, FirstFailingConditionIsNamed) {
  LmHeadA2aInputs in = decode_server();
  in.enable_dp_lm_head = true;
  in.attn_cp_size = 2;
  EXPECT_EQ(decide_lm_head_a2a(in).reason,
            "attn_cp_size 2: the exchange needs attention without context parallelism");
  in.tp_size = 4;
  EXPECT_EQ(decide_lm_head_a2a(in).reason, "tp_size 4 != dp_size 8: the exchange needs them equal");
  in.dp_size = 1;
  EXPECT_EQ(decide_lm_head_a2a(in).reason, "dp_size 1: no DP ranks to exchange logits with");
  in.enable_dp_attention = false;
  EXPECT_EQ(decide_lm_head_a2a(in).reason, "DP attention is off");
  in.disaggregation_mode = DisaggregationMode::kPrefill;
  EXPECT_EQ(decide_lm_head_a2a(in).reason, "disaggregation mode prefill: not a decode server");
}

TEST(LmHeadA2aPolicy, ExplicitOffWins) {
  LmHeadA2aInputs in = decode_server();
  in.lm_head_a2a = Switch::kOff;
  LmHeadA2aDecision d = decide_lm_head_a2a(in);
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(d.reason, "LM-head all-to-all forced off by the user");
  // Off needs none of the conditions that forcing it on does.
  in.enable_dp_attention = false;
  in.enable_dp_lm_head = true;
  in.dp_size = 2;
  in.attn_cp_size = 4;
  d = decide_lm_head_a2a(in);
  EXPECT_FALSE(d.enabled);
  EXPECT_EQ(d.reason, "LM-head all-to-all forced off by the user");
}

// kOn wins over the conditions SGLang does not assert: the server's role and dp_size > 1.
TEST(LmHeadA2aPolicy, ExplicitOnWins) {
  const std::vector<void (*)(LmHeadA2aInputs&)> changes = {
      [](LmHeadA2aInputs&) {},
      [](LmHeadA2aInputs& in) { in.disaggregation_mode = DisaggregationMode::kPrefill; },
      [](LmHeadA2aInputs& in) { in.disaggregation_mode = DisaggregationMode::kNull; },
      [](LmHeadA2aInputs& in) {
        in.dp_size = 1;
        in.tp_size = 1;
      },
  };
  for (std::size_t i = 0; i < changes.size(); ++i) {
    SCOPED_TRACE("change " + std::to_string(i));
    LmHeadA2aInputs in = decode_server();
    in.lm_head_a2a = Switch::kOn;
    changes[i](in);
    const LmHeadA2aDecision d = decide_lm_head_a2a(in);
    EXPECT_TRUE(d.enabled);
    EXPECT_EQ(d.reason, "LM-head all-to-all forced on by the user");
  }
}

// Forced on where the layout cannot carry the exchange: SGLang's assertions, as errors.
TEST(LmHeadA2aPolicy, ExplicitOnIsValidated) {
  struct Bad {
    void (*change)(LmHeadA2aInputs&);
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {[](LmHeadA2aInputs& in) { in.enable_dp_attention = false; },
            "the LM-head all-to-all is forced on, but it needs DP attention "
            "(enable_dp_attention is false)"},
           {[](LmHeadA2aInputs& in) { in.enable_dp_lm_head = true; },
            "the LM-head all-to-all is forced on, but it needs the DP LM head off "
            "(enable_dp_lm_head is true)"},
           {[](LmHeadA2aInputs& in) { in.dp_size = 4; },
            "the LM-head all-to-all is forced on, but it needs tp_size == dp_size (tp 8, dp 4)"},
           {[](LmHeadA2aInputs& in) { in.attn_cp_size = 2; },
            "the LM-head all-to-all is forced on, but it needs attn_cp_size == 1 (attn_cp 2)"},
       }) {
    SCOPED_TRACE(b.message);
    LmHeadA2aInputs in = decode_server();
    in.lm_head_a2a = Switch::kOn;
    b.change(in);
    try {
      (void)decide_lm_head_a2a(in);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_TRUE(contains(e.what(), b.message)) << e.what();
    }
    // The same layout under auto is a decision, not an error.
    in.lm_head_a2a = Switch::kAuto;
    EXPECT_FALSE(decide_lm_head_a2a(in).enabled);
  }
}

// Several violations at once: the first of SGLang's assertions is reported.
TEST(LmHeadA2aPolicy, ExplicitOnReportsTheFirstViolation) {
  LmHeadA2aInputs in = decode_server();
  in.lm_head_a2a = Switch::kOn;
  in.enable_dp_attention = false;
  in.enable_dp_lm_head = true;
  in.dp_size = 4;
  in.attn_cp_size = 2;
  try {
    (void)decide_lm_head_a2a(in);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "needs DP attention")) << e.what();
  }
}

TEST(LmHeadA2aPolicy, OutOfRangeInputsAreErrors) {
  struct Bad {
    void (*change)(LmHeadA2aInputs&);
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {[](LmHeadA2aInputs& in) { in.dp_size = 0; }, "dp_size 0 must be at least 1"},
           {[](LmHeadA2aInputs& in) { in.tp_size = -8; }, "tp_size -8 must be at least 1"},
           {[](LmHeadA2aInputs& in) { in.attn_cp_size = 0; }, "attn_cp_size 0 must be at least 1"},
       }) {
    SCOPED_TRACE(b.message);
    LmHeadA2aInputs in = decode_server();
    b.change(in);
    for (Switch s : {Switch::kAuto, Switch::kOn, Switch::kOff}) {
      in.lm_head_a2a = s;
      try {
        (void)decide_lm_head_a2a(in);
        ADD_FAILURE() << "accepted under " << to_string(s);
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::kInvalidArgument);
        EXPECT_TRUE(contains(e.what(), b.message)) << e.what();
      }
    }
  }
}

TEST(LmHeadA2aPolicy, Names) {
  EXPECT_EQ(to_string(DisaggregationMode::kNull), "null");
  EXPECT_EQ(to_string(DisaggregationMode::kPrefill), "prefill");
  EXPECT_EQ(to_string(DisaggregationMode::kDecode), "decode");
}

// ---------------------------------------------------------------------------------------------
// `tpcomm policy`

test::ProgramResult policy(const std::string& args) {
  return test::run_program(std::string(TPCOMM_CLI_PATH) + " policy " + args + " 2>&1");
}

nlohmann::json policy_json(const std::string& args) {
  const auto r = policy(args + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return nlohmann::json::parse(r.output);
}

TEST(PolicyCommand, EveryOptionReachesTheInputs) {
  const nlohmann::json j = policy_json(
      "--arch Qwen3MoeForCausalLM --sm 100 --tp 4 --dp-attention --nnodes 2 --moe-a2a deepep "
      "--fusion on --deterministic --deterministic-group");
  const nlohmann::json& f = j.at("allreduce_fusion");
  const nlohmann::json& in = f.at("inputs");
  EXPECT_EQ(in.at("architecture"), "Qwen3MoeForCausalLM");
  EXPECT_EQ(in.at("sm"), 100);
  EXPECT_EQ(in.at("tp_size"), 4);
  EXPECT_EQ(in.at("enable_dp_attention"), true);
  EXPECT_EQ(in.at("nnodes"), 2);
  EXPECT_EQ(in.at("moe_a2a_backend"), "deepep");
  EXPECT_EQ(in.at("deterministic_inference"), true);
  EXPECT_EQ(in.at("deterministic_group"), true);
  EXPECT_EQ(in.at("fusion"), "on");
  EXPECT_EQ(f.at("enabled"), true);
  EXPECT_EQ(f.at("backend"), "mnnvl");
  EXPECT_EQ(f.at("reason"), "fusion forced on by the user");
}

TEST(PolicyCommand, DefaultsDescribeOneH200NodeOfEight) {
  const nlohmann::json in = policy_json("").at("allreduce_fusion").at("inputs");
  EXPECT_EQ(in.at("architecture"), "");
  EXPECT_EQ(in.at("sm"), 90);
  EXPECT_EQ(in.at("tp_size"), 8);
  EXPECT_EQ(in.at("enable_dp_attention"), false);
  EXPECT_EQ(in.at("nnodes"), 1);
  EXPECT_EQ(in.at("moe_a2a_backend"), "none");
  EXPECT_EQ(in.at("deterministic_inference"), false);
  EXPECT_EQ(in.at("fusion"), "auto");
  const nlohmann::json f = policy_json("--arch DeepseekV3ForCausalLM").at("allreduce_fusion");
  EXPECT_EQ(f.at("enabled"), true);
  EXPECT_EQ(f.at("backend"), "trtllm");
}

TEST(PolicyCommand, TextNamesTheDecisionAndTheReason) {
  auto r = policy("--arch LlamaForCausalLM");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "fusion: off\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "reason: architecture LlamaForCausalLM is not in the allow-list"))
      << r.output;
  r = policy("--arch GptOssForCausalLM --sm 103");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "fusion: on (backend mnnvl)\n")) << r.output;
  r = policy("--arch GptOssForCausalLM --fusion off");
  EXPECT_TRUE(contains(r.output, "reason: fusion forced off by the user")) << r.output;
}

TEST(PolicyCommand, LmHeadOptionsReachTheInputs) {
  // --tp and --dp-attention are shared with the fusion rule.
  const nlohmann::json j = policy_json(
      "--disaggregation prefill --dp-attention --dp 4 --tp 4 --attn-cp 2 --dp-lm-head "
      "--lm-head-a2a off");
  const nlohmann::json& a = j.at("lm_head_a2a");
  const nlohmann::json& in = a.at("inputs");
  EXPECT_EQ(in.at("disaggregation_mode"), "prefill");
  EXPECT_EQ(in.at("enable_dp_attention"), true);
  EXPECT_EQ(in.at("dp_size"), 4);
  EXPECT_EQ(in.at("tp_size"), 4);
  EXPECT_EQ(in.at("attn_cp_size"), 2);
  EXPECT_EQ(in.at("enable_dp_lm_head"), true);
  EXPECT_EQ(in.at("lm_head_a2a"), "off");
  EXPECT_EQ(a.at("enabled"), false);
  EXPECT_EQ(a.at("reason"), "LM-head all-to-all forced off by the user");
  EXPECT_EQ(j.at("allreduce_fusion").at("inputs").at("tp_size"), 4);
}

TEST(PolicyCommand, LmHeadDefaultsAndAutoDecision) {
  nlohmann::json a = policy_json("").at("lm_head_a2a");
  const nlohmann::json& in = a.at("inputs");
  EXPECT_EQ(in.at("disaggregation_mode"), "null");
  EXPECT_EQ(in.at("enable_dp_attention"), false);
  EXPECT_EQ(in.at("dp_size"), 1);
  EXPECT_EQ(in.at("tp_size"), 8);
  EXPECT_EQ(in.at("attn_cp_size"), 1);
  EXPECT_EQ(in.at("enable_dp_lm_head"), false);
  EXPECT_EQ(in.at("lm_head_a2a"), "auto");
  EXPECT_EQ(a.at("enabled"), false);
  EXPECT_EQ(a.at("reason"), "disaggregation mode null: not a decode server");
  a = policy_json("--disaggregation decode --dp-attention --dp 8").at("lm_head_a2a");
  EXPECT_EQ(a.at("enabled"), true);
  EXPECT_EQ(a.at("reason"),
            "auto: decode server, DP attention on, dp_size 8, tp_size 8 == dp_size, "
            "attn_cp_size 1, DP LM head off");
}

TEST(PolicyCommand, TextNamesTheLmHeadDecisionAndTheReason) {
  auto r = policy("--disaggregation decode --dp-attention --dp 8");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "LM-head all-to-all: on\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "reason: auto: decode server")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "inputs: disaggregation decode, dp-attention on, dp 8, tp 8, attn-cp 1, "
                       "dp-lm-head off, lm-head-a2a auto\n"))
      << r.output;
  r = policy("--disaggregation decode --dp-attention --dp 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "LM-head all-to-all: off\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "reason: tp_size 8 != dp_size 4: the exchange needs them equal"))
      << r.output;
  r = policy("--dp-attention --dp 8 --lm-head-a2a on");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "LM-head all-to-all: on\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "reason: LM-head all-to-all forced on by the user")) << r.output;
}

TEST(PolicyCommand, BadInputIsRefused) {
  for (const char* bad :
       {"--fusion maybe", "--fusion ON", "--tp 0", "--nnodes 0", "--sm -1", "--sm ninety",
        "--unknown-option", "--lm-head-a2a maybe", "--lm-head-a2a 1", "--disaggregation colocated",
        "--disaggregation Decode", "--dp 0", "--attn-cp 0"}) {
    SCOPED_TRACE(bad);
    const auto r = policy(bad);
    EXPECT_NE(r.exit_code, 0) << r.output;
  }
  // A forced fusion without a backend is an error, not a decision.
  const auto r = policy("--arch DeepseekV3ForCausalLM --sm 80 --fusion on");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "SM80 has no fused all-reduce backend")) << r.output;
  // So is a forced all-to-all on a layout that cannot carry it.
  const auto a = policy("--dp-attention --dp 4 --lm-head-a2a on");
  EXPECT_EQ(a.exit_code, 1) << a.output;
  EXPECT_TRUE(contains(a.output, "needs tp_size == dp_size (tp 8, dp 4)")) << a.output;
}

}  // namespace
}  // namespace tpcomm
