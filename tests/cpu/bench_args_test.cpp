// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench`'s arguments (nccl-tests' flags) and the arithmetic of its report.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/run_program.hpp"
#include "tools/bench_args.hpp"
#include "tune/algorithms.hpp"

#ifndef TPCOMM_CLI_PATH
#error "TPCOMM_CLI_PATH must name the tpcomm program"
#endif

namespace tpcomm::tools {
namespace {

/// Parses `args` as the bench subcommand would; throws CLI::Error on bad input.
BenchOptions parse(std::vector<std::string> args) {
  BenchOptions o;
  CLI::App app;
  add_bench_options(app, o);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  return o;
}

TEST(BenchArgs, NcclTestsFlags) {
  BenchOptions o = parse({"-b", "1K",       "-e",      "64M",    "-f",       "2",
                          "-n", "50",       "-w",      "3",      "-c",       "2",
                          "-d", "bfloat16", "-o",      "max",    "--op",     "reducescatter",
                          "-u", "3",        "--graph", "--json", "out.json", "--virtual-ranks",
                          "4",  "--seed",   "7"});
  EXPECT_EQ(o.min_bytes, 1024);
  EXPECT_EQ(o.max_bytes, 64 << 20);
  EXPECT_EQ(o.step_factor, 2);
  EXPECT_EQ(o.iters, 50);
  EXPECT_EQ(o.warmup, 3);
  EXPECT_EQ(o.check, 2);
  EXPECT_EQ(o.dtype, DType::kBF16);
  EXPECT_EQ(o.redop, ReduceOp::kMax);
  EXPECT_EQ(o.op, kernels::Collective::kReduceScatter);
  EXPECT_EQ(o.unalign, 3);
  EXPECT_TRUE(o.graph);
  EXPECT_EQ(o.json, "out.json");
  EXPECT_EQ(o.virtual_ranks, 4);
  EXPECT_EQ(o.seed, 7u);
}

TEST(BenchArgs, Defaults) {
  BenchOptions o = parse({});
  EXPECT_EQ(o.min_bytes, 32 << 20);
  EXPECT_EQ(o.max_bytes, 32 << 20);
  EXPECT_EQ(o.dtype, DType::kF32);
  EXPECT_EQ(o.redop, ReduceOp::kSum);
  EXPECT_EQ(o.op, kernels::Collective::kAllReduce);
  EXPECT_EQ(o.algos, std::vector<BenchAlgo>{BenchAlgo{}});
  EXPECT_FALSE(o.graph);
}

std::vector<std::string> names(const std::vector<BenchAlgo>& algos) {
  std::vector<std::string> out;
  for (const BenchAlgo& a : algos) out.push_back(a.name);
  return out;
}

TEST(BenchArgs, AlgorithmLists) {
  EXPECT_EQ(names(parse({"--algo", "one_shot,two_shot"}).algos),
            (std::vector<std::string>{"one_shot", "two_shot"}));
  EXPECT_EQ(parse({"--algo", "nccl-direct,memcpy"}).algos,
            (std::vector<BenchAlgo>{{BenchAlgo::Kind::kNcclDirect, "nccl_direct"},
                                    {BenchAlgo::Kind::kMemcpy, "memcpy"}}));
  EXPECT_EQ(names(parse({"--algo", "lamport,auto"}).algos),
            (std::vector<std::string>{"lamport", "auto"}));
  EXPECT_EQ(names(parse({"--algo", "lamport_two_shot,One-Shot"}).algos),
            (std::vector<std::string>{"lamport_two_shot", "one_shot"}));
  EXPECT_TRUE(parse({"--algo", "one_shot"}).algos[0].pins_custom());
  EXPECT_FALSE(parse({"--algo", "nccl"}).algos[0].pins_custom());
  // auto, every algorithm of the registry, nccl, nccl_direct, memcpy.
  EXPECT_EQ(parse({"--algo", "all"}).algos.size(), kAlgorithms.size() + 4);
  // auto, the exchange algorithms, nccl, nccl_direct, memcpy; the LM head adds all_gather and
  // has no direct NCCL call.
  EXPECT_EQ(parse({"--op", "allgather", "--algo", "all"}).algos.size(),
            kExchangeAlgorithms.size() + 4);
  EXPECT_EQ(names(parse({"--op", "lm_head_exchange", "--algo", "all"}).algos),
            (std::vector<std::string>{"auto", "pull", "push", "all_gather", "nccl", "memcpy"}));
  EXPECT_EQ(parse({"--algo", "pull"}).algos[0].kind, BenchAlgo::Kind::kExchange);
  EXPECT_FALSE(parse({"--algo", "pull"}).algos[0].pins_custom());
}

TEST(BenchArgs, Gather) {
  BenchOptions o = parse({"--op", "gather", "-r", "1", "--algo", "all"});
  EXPECT_TRUE(o.gather);
  EXPECT_FALSE(o.lm_head);
  EXPECT_EQ(o.op, kernels::Collective::kAllGather);  // the all-gather's sizes and data
  EXPECT_EQ(o.root, 1);
  EXPECT_TRUE(exchange_op(o));
  // auto, the exchange algorithms, nccl, memcpy: NCCL called directly has no gather.
  EXPECT_EQ(names(o.algos), (std::vector<std::string>{"auto", "pull", "push", "nccl", "memcpy"}));
  EXPECT_FALSE(parse({"--op", "allgather"}).gather);
}

TEST(BenchArgs, LmHeadExchange) {
  BenchOptions o = parse({"--op", "lm_head_exchange", "--vocab", "1000", "--tokens", "1,36,120"});
  EXPECT_TRUE(o.lm_head);
  EXPECT_FALSE(o.add_rmsnorm);
  EXPECT_EQ(o.op, kernels::Collective::kAllToAll);
  EXPECT_EQ(o.vocab, 1000);
  EXPECT_EQ(o.tokens, (std::vector<std::int64_t>{1, 36, 120}));
  EXPECT_TRUE(exchange_op(o));
  EXPECT_TRUE(exchange_op(parse({"--op", "allgather"})));
  EXPECT_FALSE(exchange_op(parse({"--op", "reducescatter"})));
  EXPECT_EQ(parse({"--algo", "all_gather"}).algos[0].kind, BenchAlgo::Kind::kLmHeadAllGather);
  for (std::vector<std::string> bad :
       std::vector<std::vector<std::string>>{{"--op", "lm_head_exchange", "--vocab", "0"},
                                             {"--op", "lm_head_exchange", "--tokens", "0"},
                                             {"--op", "lm_head_exchange", "--tokens", "1,x"}})
    EXPECT_THROW(parse(bad), CLI::Error) << bad[2] << " " << bad[3];
}

TEST(BenchArgs, MoeFinalize) {
  BenchOptions o = parse({"--op", "moe_finalize", "--hidden", "7168", "--top-k", "4",
                          "--shared-expert", "--algo", "all"});
  EXPECT_TRUE(o.moe);
  EXPECT_TRUE(o.add_rmsnorm);  // the fused operation's sizes, outputs and checks
  EXPECT_EQ(o.op, kernels::Collective::kAllReduce);
  EXPECT_EQ(o.top_k, 4);
  EXPECT_TRUE(o.shared_expert);
  // The fused norm's rows, with the two forms of the combine after auto.
  std::vector<std::string> fused =
      names(parse({"--op", "allreduce_add_rmsnorm", "--algo", "all"}).algos);
  fused.insert(fused.begin() + 1, {"prologue", "combine_first"});
  EXPECT_EQ(names(o.algos), fused);
  const BenchOptions plain = parse({"--op", "allreduce_add_rmsnorm"});
  EXPECT_FALSE(plain.moe);
  EXPECT_EQ(plain.top_k, 8);
  EXPECT_FALSE(plain.shared_expert);
  for (const char* k : {"0", "33", "x"})
    EXPECT_THROW(parse({"--op", "moe_finalize", "--top-k", k}), CLI::Error) << k;
}

TEST(BenchArgs, ReduceScatterAddRmsNorm) {
  BenchOptions o = parse(
      {"--op", "reducescatter_add_rmsnorm", "--hidden", "4096", "-d", "bfloat16", "--algo", "all"});
  EXPECT_TRUE(o.scattered);
  EXPECT_TRUE(o.add_rmsnorm);  // the fused operation's outputs, checks and JSON shape
  EXPECT_FALSE(o.moe);
  EXPECT_EQ(o.op, kernels::Collective::kReduceScatter);  // its bus factor and check
  EXPECT_EQ(bench_op_name(o), "reducescatter_add_rmsnorm");
  // No custom kernel serves a scattered sum: the group's choice, the pair it replaces and the
  // form without sequence parallelism.
  EXPECT_EQ(names(o.algos), (std::vector<std::string>{"auto", "unfused", "allreduce_add_rmsnorm"}));
  EXPECT_EQ(o.algos[2].kind, BenchAlgo::Kind::kUnscattered);
  // The audit leaves the all-reduce form out: it is not a path of the operation.
  EXPECT_EQ(names(parse({"--op", "reducescatter_add_rmsnorm", "--audit"}).algos),
            (std::vector<std::string>{"auto", "unfused"}));
  const BenchOptions plain = parse({"--op", "allreduce_add_rmsnorm", "-d", "bfloat16"});
  EXPECT_FALSE(plain.scattered);
  EXPECT_EQ(plain.op, kernels::Collective::kAllReduce);

  // Whole rows of --hidden, at least one, rounded up to a multiple of the world size.
  const std::int64_t row = 4096 * 2;
  EXPECT_EQ(fused_count(o, 3 * row, 1), 3 * 4096);
  EXPECT_EQ(fused_count(o, 3 * row, 2), 4 * 4096);
  EXPECT_EQ(fused_count(o, 3 * row + row / 2, 4), 4 * 4096);
  EXPECT_EQ(fused_count(o, 8 * row, 8), 8 * 4096);
  EXPECT_EQ(fused_count(o, 1, 8), 8 * 4096);
  EXPECT_EQ(fused_count(o, 9 * row, 8), 16 * 4096);
  // The all-reduce form keeps the rows it is given.
  EXPECT_EQ(fused_count(plain, 3 * row, 8), 3 * 4096);

  // The rows that are not ways to run it are skipped, each with its reason.
  for (const char* name : {"auto", "nccl", "unfused", "allreduce_add_rmsnorm"})
    EXPECT_EQ(row_refusal(o, *parse_bench_algo(name)), "") << name;
  EXPECT_NE(row_refusal(o, *parse_bench_algo("lamport")).find("scattered"), std::string::npos);
  for (const char* name : {"allreduce", "prologue", "memcpy", "nccl_direct", "pull"})
    EXPECT_NE(row_refusal(o, *parse_bench_algo(name)), "") << name;
  EXPECT_NE(row_refusal(plain, *parse_bench_algo("allreduce_add_rmsnorm")), "");
  EXPECT_EQ(row_refusal(plain, *parse_bench_algo("allreduce")), "");

  // The fused operations sum floating-point rows.
  for (const char* op : {"reducescatter_add_rmsnorm", "allreduce_add_rmsnorm", "moe_finalize"}) {
    EXPECT_THROW(parse({"--op", op, "-o", "max"}), CLI::ValidationError) << op;
    EXPECT_THROW(parse({"--op", op, "-d", "int32"}), CLI::ValidationError) << op;
    EXPECT_NO_THROW(parse({"--op", op, "-d", "half"})) << op;
  }
  EXPECT_THROW(parse({"--op", "reducescatter_add_rmsnorm", "--hidden", "0"}), CLI::Error);
}

TEST(BenchArgs, BadInputIsRefused) {
  for (std::vector<std::string> bad :
       std::vector<std::vector<std::string>>{{"-b", "1X"},
                                             {"-b", "64M", "-e", "1K"},
                                             {"-f", "1"},
                                             {"-f", "2", "-i", "1M"},
                                             {"-d", "float7"},
                                             {"-o", "mulsum"},
                                             {"--op", "allscatter"},
                                             {"--algo", "fastest"},
                                             {"-n", "0"},
                                             {"-g", "2", "--virtual-ranks", "2"},
                                             {"--virtual-ranks", "9"}}) {
    EXPECT_THROW(parse(bad), CLI::Error) << bad[0] << " " << (bad.size() > 1 ? bad[1] : "");
  }
}

TEST(BenchArgs, SizeListsHaveBounds) {
  auto expect_refused = [](std::vector<std::string> bad, const std::string& needle) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad[0] << " " << bad[1] << " ...";
    } catch (const CLI::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // A maximum whose steps would overflow 64 bits.
  expect_refused({"-b", "1", "-e", "9223372036854775807", "-f", "1000"}, "at most");
  // 10^9 sizes.
  expect_refused({"-b", "1", "-e", "1G", "-i", "1"}, "sizes");
  // Factors that are not factors, or do not fit.
  expect_refused({"-f", "-1"}, "from 2 to");
  expect_refused({"-f", "99999999999999999999"}, "from 2 to");
  expect_refused({"-i", "0"}, "step");
  // Ranges a person would write, not the largest double's 309 digits.
  expect_refused({"-r", "-1"}, "range 0 to 1023");
  // The limits themselves are accepted.
  BenchOptions o = parse({"-b", "1", "-e", std::to_string(kMaxBenchBytes), "-f", "2"});
  EXPECT_EQ(bench_sizes(o).size(), 37u);
  o = parse({"-b", "1", "-e", std::to_string(kMaxBenchSizes), "-i", "1"});
  EXPECT_EQ(bench_sizes(o).size(), static_cast<std::size_t>(kMaxBenchSizes));
}

// The program's own `bench` command, as `tpcomm` builds it, must validate its flags before it
// looks for a GPU (validation errors exit with CLI11's code 105, a missing GPU with 77).
TEST(BenchArgs, TheProgramRunsItsChecks) {
  const std::string cli = test::built_file(TPCOMM_CLI_PATH);
  if (test::run_program(cli + " --help").output.find("  bench") == std::string::npos)
    GTEST_SKIP() << "this tpcomm was built without bench (no nvcc)";
  for (const char* bad :
       {"-b 1M -e 1K", "-b 0", "-f 1", "-b 1 -e 1G -i 1", "-r -1",
        "--op reducescatter_add_rmsnorm -o max", "--op reducescatter_add_rmsnorm -d int32",
        "--op reducescatter_add_rmsnorm --algo one_shot,bogus"}) {
    const auto r = test::run_program(cli + " bench " + std::string(bad) + " 2>&1");
    EXPECT_EQ(r.exit_code, 105) << bad << ": " << r.output;
    EXPECT_EQ(r.output.find("CUDA"), std::string::npos) << bad << ": " << r.output;
    EXPECT_EQ(r.output.find("179769"), std::string::npos) << bad << ": " << r.output;
  }
  // `tune` checks its deadline too.
  const auto tune = test::run_program(cli + " tune --timeout -1 2>&1");
  EXPECT_EQ(tune.exit_code, 105) << tune.output;
}

// As `add_bench_command` builds the command: its body is scheduled only once the checks passed.
TEST(BenchArgs, ChecksRunBeforeTheCommandIsScheduled) {
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"bench", "-b", "1M", "-e", "1K"}, {"bench", "-b", "0"}, {"bench", "-f", "1"}}) {
    CLI::App app;
    BenchOptions o;
    bool scheduled = false;
    add_bench_options(*app.add_subcommand("bench"), o, [&] { scheduled = true; });
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    EXPECT_THROW(app.parse(reversed), CLI::ValidationError) << args[1] << " " << args[2];
    EXPECT_FALSE(scheduled);
  }
  CLI::App app;
  BenchOptions o;
  bool scheduled = false;
  add_bench_options(*app.add_subcommand("bench"), o, [&] { scheduled = true; });
  std::vector<std::string> args{"64M", "-e", "bench"};
  app.parse(args);
  EXPECT_TRUE(scheduled);
}

TEST(BenchArgs, SizesStepLikeNcclTests) {
  BenchOptions o;
  o.min_bytes = 1024;
  o.max_bytes = 8192;
  o.step_factor = 2;
  EXPECT_EQ(bench_sizes(o), (std::vector<std::int64_t>{1024, 2048, 4096, 8192}));
  o.step_factor = 3;
  EXPECT_EQ(bench_sizes(o), (std::vector<std::int64_t>{1024, 3072}));
  o.step_factor = 0;
  o.step_bytes = 3000;
  EXPECT_EQ(bench_sizes(o), (std::vector<std::int64_t>{1024, 4024, 7024}));
  o.min_bytes = o.max_bytes = 4;
  EXPECT_EQ(bench_sizes(o), (std::vector<std::int64_t>{4}));
}

TEST(BenchArgs, BusFactorsAreNcclTests) {
  using C = kernels::Collective;
  EXPECT_DOUBLE_EQ(bus_factor(C::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(C::kAllReduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_factor(C::kAllGather, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(C::kReduceScatter, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(C::kAllToAll, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(C::kBroadcast, 8), 1.0);
}

TEST(BenchArgs, CountsSplitEvenlyWhereTheCollectiveNeedsIt) {
  using C = kernels::Collective;
  EXPECT_EQ(bench_count(C::kAllReduce, 1000, DType::kF32, 8), 250);
  EXPECT_EQ(bench_count(C::kAllReduce, 1001, DType::kBF16, 8), 500);
  EXPECT_EQ(bench_count(C::kAllGather, 1000, DType::kF32, 8), 248);
  EXPECT_EQ(bench_count(C::kReduceScatter, 1000, DType::kF32, 3), 249);
  EXPECT_EQ(bench_count(C::kAllToAll, 64, DType::kF64, 8), 8);
  EXPECT_EQ(bench_count(C::kBroadcast, 10, DType::kF32, 8), 2);
}

}  // namespace
}  // namespace tpcomm::tools
