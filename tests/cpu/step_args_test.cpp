// SPDX-License-Identifier: Apache-2.0
// `tpcomm step`'s arguments, as the program builds the command.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/run_program.hpp"
#include "tools/step_args.hpp"

#ifndef TPCOMM_CLI_PATH
#error "TPCOMM_CLI_PATH must name the tpcomm program"
#endif

namespace tpcomm::tools {
namespace {

/// Parses `args` as the `step` subcommand would, reporting whether its body was scheduled;
/// throws CLI::Error on bad input.
StepOptions parse(std::vector<std::string> args, bool* scheduled = nullptr) {
  StepOptions o;
  CLI::App app;
  bool ran = false;
  add_step_options(*app.add_subcommand("step"), o, [&] { ran = true; });
  args.insert(args.begin(), "step");
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  if (scheduled != nullptr) *scheduled = ran;
  return o;
}

TEST(StepArgs, Flags) {
  bool scheduled = false;
  StepOptions o = parse({"--model",
                         "deepseek-v3",
                         "--tp",
                         "8",
                         "--tokens",
                         "1,128",
                         "--virtual-ranks",
                         "8",
                         "--compute-us",
                         "20.5",
                         "--json",
                         "s.json",
                         "--plot",
                         "s.png",
                         "-n",
                         "7",
                         "-w",
                         "2",
                         "--seed",
                         "9",
                         "--moe-combine",
                         "separate"},
                        &scheduled);
  EXPECT_TRUE(scheduled);
  EXPECT_EQ(o.model, "deepseek-v3");
  EXPECT_EQ(o.tp, 8);
  EXPECT_EQ(o.tokens, (std::vector<std::int64_t>{1, 128}));
  EXPECT_EQ(o.virtual_ranks, 8);
  EXPECT_DOUBLE_EQ(o.compute_us, 20.5);
  EXPECT_EQ(o.json, "s.json");
  EXPECT_EQ(o.plot, "s.png");
  EXPECT_EQ(o.replays, 7);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(o.seed, 9u);
  EXPECT_FALSE(o.moe_fused);
  EXPECT_EQ(step_plot_json(o), "s.json");
}

TEST(StepArgs, Defaults) {
  StepOptions o = parse({"--model", "m.json", "--tp", "2", "-g", "2"});
  EXPECT_EQ(o.tokens, (std::vector<std::int64_t>{1, 8, 32, 128}));
  EXPECT_EQ(o.gpus, 2);
  EXPECT_EQ(o.virtual_ranks, 0);
  EXPECT_EQ(o.compute_us, 0);
  EXPECT_TRUE(o.json.empty());
  EXPECT_TRUE(o.moe_fused);
  EXPECT_TRUE(parse({"--model", "m", "--tp", "2", "--moe-combine", "fused"}).moe_fused);
  // --plot alone: the JSON goes next to the picture.
  o.plot = "out/step.png";
  EXPECT_EQ(step_plot_json(o), "out/step.json");
}

TEST(StepArgs, BadInputIsRefusedBeforeTheCommandIsScheduled) {
  const std::vector<std::string> base{"--model", "deepseek-v3"};
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--tp", "2"},               // no --model
           {"--model", "deepseek-v3"},  // no --tp
           {"--model", "x", "--tp", "0"},
           {"--model", "x", "--tp", "65"},
           {"--model", "x", "--tp", "two"},
           {"--model", "x", "--tp", "2", "--tokens", "0"},
           {"--model", "x", "--tp", "2", "--tokens", "1,-8"},
           {"--model", "x", "--tp", "2", "--tokens", "1,x"},
           {"--model", "x", "--tp", "2", "--tokens", "2000000"},
           {"--model", "x", "--tp", "2", "--compute-us", "-1"},
           {"--model", "x", "--tp", "2", "--compute-us", "1e9"},
           {"--model", "x", "--tp", "2", "--compute-us", "nan"},
           {"--model", "x", "--tp", "2", "--compute-us", "-nan"},
           {"--model", "x", "--tp", "2", "-n", "0"},
           {"--model", "x", "--tp", "2", "-w", "-1"},
           {"--model", "x", "--tp", "2", "--moe-combine", "apart"},
           {"--model", "x", "--tp", "2", "--moe-combine", ""},
           {"--model", "x", "--tp", "4", "--virtual-ranks", "2"},
           {"--model", "x", "--tp", "16", "--virtual-ranks", "16"},
           {"--model", "x", "--tp", "2", "-g", "4"},
           {"--model", "x", "--tp", "2", "-g", "2", "--virtual-ranks", "2"},
           {"--model", "x", "--tp", "2", "--plot", "same.json"},
           {"--model", "x", "--tp", "2", "--json", "a.json", "--plot", "a.json"},
       }) {
    std::string text;
    for (const std::string& a : bad) text += a + " ";
    bool scheduled = false;
    EXPECT_THROW(parse(bad, &scheduled), CLI::Error) << text;
    EXPECT_FALSE(scheduled) << text;
  }
  std::vector<std::string> many{"--model", "x", "--tp", "2", "--tokens"};
  std::string list;
  for (std::size_t i = 0; i <= kMaxStepTokenCounts; ++i)
    list += (i ? "," : "") + std::to_string(i + 1);
  many.push_back(list);
  EXPECT_THROW(parse(many), CLI::ValidationError);
}

// The program's own `step` command validates its flags, and finds its model, before it looks
// for a GPU (CLI11's codes: 105 for a bad value, 106 for a missing option; a bad model: 1).
TEST(StepArgs, TheProgramRunsItsChecks) {
  const std::string cli = test::built_file(TPCOMM_CLI_PATH);
  if (test::run_program(cli + " --help").output.find("  step") == std::string::npos)
    GTEST_SKIP() << "this tpcomm was built without step (no nvcc)";
  struct Case {
    const char* args;
    int code;
  };
  for (const Case& c :
       {Case{"--model deepseek-v3 --tp 8 --virtual-ranks 4", 105},
        Case{"--model deepseek-v3 --tp 2 --tokens 0", 105}, Case{"--model deepseek-v3", 106}}) {
    const auto r = test::run_program(cli + " step " + std::string(c.args) + " 2>&1");
    EXPECT_EQ(r.exit_code, c.code) << c.args << ": " << r.output;
    EXPECT_EQ(r.output.find("CUDA"), std::string::npos) << c.args << ": " << r.output;
  }
  const auto unknown = test::run_program(cli + " step --model gpt-5 --tp 2 --virtual-ranks 2 2>&1");
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_NE(unknown.output.find("gpt-5"), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("deepseek-v3"), std::string::npos) << unknown.output;
  const auto missing =
      test::run_program(cli + " step --model /nonexistent/m.json --tp 2 --virtual-ranks 2 2>&1");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("/nonexistent/m.json"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace tpcomm::tools
