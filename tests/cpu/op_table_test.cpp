// SPDX-License-Identifier: Apache-2.0
// NOTE [the operation table] (backends/op.hpp): the lists of operations written elsewhere — C's
// `tpcomm_op`, the test data's `Collective`, the step's `StepOpKind` — agree with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "backends/fingerprint.hpp"
#include "backends/op.hpp"
#include "kernels/test_data.hpp"
#include "tools/step_plan.hpp"

#ifndef TPCOMM_SOURCE_DIR
#error "TPCOMM_SOURCE_DIR must name the source tree"
#endif

namespace tpcomm {
namespace {

std::string upper(std::string_view s) {
  std::string u(s);
  std::transform(u.begin(), u.end(), u.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return u;
}

TEST(OpTable, RowsAreInTheEnumsOrderWithDistinctNames) {
  std::set<std::string_view> names, short_names;
  std::set<int> codes;
  for (std::size_t i = 0; i < kOpCount; ++i) {
    const OpRow& r = kOps[i];
    EXPECT_EQ(static_cast<std::size_t>(r.op), i) << r.name;
    EXPECT_EQ(to_string(r.op), r.name);
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_TRUE(short_names.insert(r.short_name).second) << r.short_name;
    if (r.c_code >= 0) {
      EXPECT_TRUE(codes.insert(r.c_code).second) << r.name;
    }
  }
  EXPECT_EQ(to_string(static_cast<Op>(kOpCount)), "unknown");
}

// Every operation's fingerprint reads back as its name; one past the table does not.
TEST(OpTable, FingerprintsNameEveryOperation) {
  for (const OpRow& r : kOps) {
    const std::string text = describe_fingerprint(fingerprint(r.op, DType::kBF16, 16, 0));
    EXPECT_EQ(text.rfind(std::string(r.name) + " 16 ", 0), 0u) << text;
  }
  const std::uint64_t past = std::uint64_t{kOpCount + 1} << 60 | 16;
  EXPECT_NE(describe_fingerprint(past).find("unknown fingerprint"), std::string::npos);
}

// C's `tpcomm_op` holds exactly the rows with a C value, named TPCOMM_OP_<SHORT NAME>.
TEST(OpTable, CEnumIsTheTables) {
  std::ifstream in(std::string(TPCOMM_SOURCE_DIR) + "/include/tpcomm/tpcomm.h");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string header = text.str();
  const auto begin = header.find("typedef enum tpcomm_op {");
  const auto end = header.find("} tpcomm_op;");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const std::string body = header.substr(begin, end - begin);
  std::map<std::string, int> in_c;
  const std::regex entry("TPCOMM_OP_([A-Z0-9_]+) = ([0-9]+)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), entry);
       it != std::sregex_iterator(); ++it)
    in_c[(*it)[1].str()] = std::stoi((*it)[2].str());
  std::map<std::string, int> in_table;
  for (const OpRow& r : kOps)
    if (r.c_code >= 0) in_table[upper(r.short_name)] = r.c_code;
  EXPECT_EQ(in_c, in_table);
}

// The test data's collectives are the table's first rows, in its order.
TEST(OpTable, TestDataCollectivesAreTheTables) {
  EXPECT_EQ(static_cast<int>(kernels::Collective::kAllReduce), static_cast<int>(Op::kAllReduce));
  EXPECT_EQ(static_cast<int>(kernels::Collective::kAllGather), static_cast<int>(Op::kAllGather));
  EXPECT_EQ(static_cast<int>(kernels::Collective::kReduceScatter),
            static_cast<int>(Op::kReduceScatter));
  EXPECT_EQ(static_cast<int>(kernels::Collective::kAllToAll), static_cast<int>(Op::kAllToAll));
  EXPECT_EQ(static_cast<int>(kernels::Collective::kBroadcast), static_cast<int>(Op::kBroadcast));
}

// Each kind of a decode step's calls is an operation of the table.
TEST(OpTable, StepCallsAreTheTables) {
  using tools::operation;
  using tools::StepOpKind;
  EXPECT_EQ(operation(StepOpKind::kAttnReduce), Op::kAllReduceAddRmsNorm);
  EXPECT_EQ(operation(StepOpKind::kMlpReduce), Op::kAllReduceAddRmsNorm);
  EXPECT_EQ(operation(StepOpKind::kMoeReduce), Op::kMoeFinalize);
  EXPECT_EQ(operation(StepOpKind::kLmHead), Op::kLmHeadExchange);
}

}  // namespace
}  // namespace tpcomm
