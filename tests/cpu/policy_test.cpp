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
      "--fusion on --deterministic");
  const nlohmann::json& f = j.at("allreduce_fusion");
  const nlohmann::json& in = f.at("inputs");
  EXPECT_EQ(in.at("architecture"), "Qwen3MoeForCausalLM");
  EXPECT_EQ(in.at("sm"), 100);
  EXPECT_EQ(in.at("tp_size"), 4);
  EXPECT_EQ(in.at("enable_dp_attention"), true);
  EXPECT_EQ(in.at("nnodes"), 2);
  EXPECT_EQ(in.at("moe_a2a_backend"), "deepep");
  EXPECT_EQ(in.at("deterministic_inference"), true);
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

TEST(PolicyCommand, BadInputIsRefused) {
  for (const char* bad : {"--fusion maybe", "--fusion ON", "--tp 0", "--nnodes 0", "--sm -1",
                          "--sm ninety", "--unknown-option"}) {
    SCOPED_TRACE(bad);
    const auto r = policy(bad);
    EXPECT_NE(r.exit_code, 0) << r.output;
  }
  // A forced fusion without a backend is an error, not a decision.
  const auto r = policy("--arch DeepseekV3ForCausalLM --sm 80 --fusion on");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "SM80 has no fused all-reduce backend")) << r.output;
}

}  // namespace
}  // namespace tpcomm
