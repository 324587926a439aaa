// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench --audit`'s comparison, on recorded rows.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "tools/audit.hpp"
#include "tools/bench_args.hpp"

namespace tpcomm::tools {
namespace {

/// A recorded bench row: `algo` at `size` took `us` (out of place), served by `path`.
nlohmann::json row(const std::string& algo, std::int64_t size, double us,
                   const std::string& path = "custom_ar:one_shot") {
  return {{"algo", algo},       {"op", "allreduce"}, {"size", size},
          {"world_size", 4},    {"served_by", path}, {"out_of_place", {{"time_us", us}}},
          {"in_place", nullptr}};
}

TEST(Audit, APlantedLossIsReportedWithItsMargin) {
  nlohmann::json rows = nlohmann::json::array();
  for (double us : {10.0, 10.1, 9.9}) rows.push_back(row("auto", 4096, us));
  for (double us : {8.0, 8.2, 7.9}) rows.push_back(row("two_shot", 4096, us, "custom_ar:two_shot"));
  for (double us : {12.0, 12.0, 12.0}) rows.push_back(row("one_shot", 4096, us));
  const auto losses = audit_losses(rows);
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].size, 4096);
  EXPECT_EQ(losses[0].world_size, 4);
  EXPECT_EQ(losses[0].best_algo, "two_shot");
  EXPECT_EQ(losses[0].best_path, "custom_ar:two_shot");
  EXPECT_DOUBLE_EQ(losses[0].builtin_us, 10.0);  // the medians
  EXPECT_DOUBLE_EQ(losses[0].best_us, 8.0);
  EXPECT_DOUBLE_EQ(losses[0].margin_us(), 2.0);
}

TEST(Audit, ALossWithinTheMarginIsNot) {
  nlohmann::json rows = nlohmann::json::array();
  // 3% of 10 us is 0.3 us: 0.29 us slower is within it, 0.31 us is not.
  rows.push_back(row("auto", 1024, 10.29));
  rows.push_back(row("two_shot", 1024, 10.0));
  rows.push_back(row("auto", 2048, 10.31));
  rows.push_back(row("two_shot", 2048, 10.0));
  // Below 6.7 us the floor of 0.2 us decides: 0.19 us slower is within it, 0.21 us is not.
  rows.push_back(row("auto", 16, 2.19));
  rows.push_back(row("two_shot", 16, 2.0));
  rows.push_back(row("auto", 32, 2.21));
  rows.push_back(row("two_shot", 32, 2.0));
  for (nlohmann::json& r : rows)
    if (r["algo"] == "two_shot") r["served_by"] = "custom_ar:two_shot";
  const auto points = audit_points(rows);
  ASSERT_EQ(points.size(), 4u);
  EXPECT_FALSE(points[0].loss);
  EXPECT_TRUE(points[1].loss);
  EXPECT_FALSE(points[2].loss);
  EXPECT_TRUE(points[3].loss);
  ASSERT_EQ(audit_losses(rows).size(), 2u);
}

TEST(Audit, TheSamePathPinnedIsNoLoss) {
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back(row("auto", 4096, 6.0, "custom_ar:lamport"));
  rows.push_back(row("lamport", 4096, 5.0, "custom_ar:lamport"));  // the same kernel: noise
  const auto points = audit_points(rows);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].best_algo, "lamport");
  EXPECT_FALSE(points[0].loss);
}

TEST(Audit, PeersFailuresAndOtherWorldsAreNotPaths) {
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back(row("auto", 4096, 10.0));
  rows.push_back(row("memcpy", 4096, 1.0));       // a limit, not a path
  rows.push_back(row("nccl_direct", 4096, 2.0));  // the peer, not a path
  rows.push_back(row("allreduce", 4096, 3.0));    // not the fused operation
  nlohmann::json failed = row("two_shot", 4096, 0);
  failed["out_of_place"] = {{"failure", "kTimeout"}};
  rows.push_back(failed);
  nlohmann::json other = row("two_shot", 4096, 5.0);
  other["world_size"] = 8;  // another point: no auto there
  rows.push_back(other);
  const auto points = audit_points(rows);
  ASSERT_EQ(points.size(), 1u);
  EXPECT_EQ(points[0].best_algo, "auto");
  EXPECT_FALSE(points[0].loss);
  EXPECT_TRUE(audit_losses(rows).empty());
}

TEST(Audit, TheAuditRunsEveryPathAndNoPeer) {
  BenchOptions o;
  CLI::App app;
  add_bench_options(app, o);
  app.parse(std::vector<std::string>{"moe_finalize", "--op", "--audit"});  // reversed
  ASSERT_FALSE(o.algos.empty());
  EXPECT_EQ(o.algos.front().name, "auto");
  bool prologue = false, combine_first = false, unfused = false;
  for (const BenchAlgo& a : o.algos) {
    EXPECT_TRUE(audited_algo(a.name)) << a.name;
    prologue |= a.name == "prologue";
    combine_first |= a.name == "combine_first";
    unfused |= a.name == "unfused";
  }
  EXPECT_TRUE(prologue && combine_first && unfused);
  EXPECT_EQ(o.audit_repeats, 3);
}

}  // namespace
}  // namespace tpcomm::tools
