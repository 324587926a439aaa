// SPDX-License-Identifier: Apache-2.0
// Deterministic groups on the host: `TPCOMM_DETERMINISTIC`, the selector's choices with
// `SelectorCaps::deterministic` (NOTE [batch invariance] in tune/selector.hpp), the calls a
// deterministic group logs or refuses, and the fusion policy with a deterministic group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/policy.hpp"
#include "tpcomm/status.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * 1024;

Options from(const std::map<std::string, std::string>& env) {
  return Options::from_lookup([&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

TEST(DeterministicKnob, OffByDefaultAndEverySpellingParses) {
  EXPECT_EQ(from({}).deterministic, Determinism::kOff);
  const std::pair<const char*, Determinism> cases[] = {
      {"0", Determinism::kOff},         {"off", Determinism::kOff},
      {"false", Determinism::kOff},     {"no", Determinism::kOff},
      {"1", Determinism::kOn},          {"on", Determinism::kOn},
      {"TRUE", Determinism::kOn},       {"yes", Determinism::kOn},
      {"strict", Determinism::kStrict}, {"Strict", Determinism::kStrict},
  };
  for (const auto& [text, want] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(from({{"TPCOMM_DETERMINISTIC", text}}).deterministic, want);
    EXPECT_EQ(parse_determinism(text), want);
  }
  for (Determinism d : {Determinism::kOff, Determinism::kOn, Determinism::kStrict})
    EXPECT_EQ(parse_determinism(to_string(d)), d);
  EXPECT_EQ(to_string(Determinism::kStrict), "strict");
}

TEST(DeterministicKnob, ABadValueThrowsNamingTheVariable) {
  for (const char* bad : {"", "2", "sometimes", "strictly", "-1"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parse_determinism(bad).has_value());
    try {
      (void)from({{"TPCOMM_DETERMINISTIC", bad}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      const std::string what = e.what();
      EXPECT_NE(what.find("TPCOMM_DETERMINISTIC"), std::string::npos) << what;
      EXPECT_NE(what.find("strict"), std::string::npos) << what;
    }
  }
}

TEST(DeterministicKnob, IsAmongTheKnobs) {
  const auto names = knob_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "TPCOMM_DETERMINISTIC"), names.end());
}

SelectorCaps caps_of(int world, bool deterministic, std::int64_t lamport = 512 * kKiB) {
  SelectorCaps c{world, true, 8 * kMiB, kMaxBlocks, lamport};
  c.deterministic = deterministic;
  return c;
}

TuneTable table_for(int world, std::vector<TuneEntry> entries, std::vector<TuneEntry> fused = {}) {
  return TuneTable(TuneKey{"NVIDIA H200", world, "one-gpu", 1, 1, "0.1.0"}, std::move(entries),
                   std::move(fused));
}

// A bucket that NCCL won in the tuned table goes to NCCL normally and to the built-in custom
// choice in a deterministic group; the staging buffer still bounds both.
TEST(DeterministicSelector, AllReduceBucketsNcclWonStayCustom) {
  for (int world : {2, 3, 4, 8}) {
    SCOPED_TRACE(world);
    const TuneTable t =
        table_for(world, {{1 * kMiB, Choice{Algo::kOneShot, 4, 256}, 1}, {8 * kMiB, Choice{}, 2}});
    auto pick = [&](std::int64_t bytes, bool det) {
      return select_all_reduce(bytes, DType::kBF16, ReduceOp::kSum, caps_of(world, det), {}, &t);
    };
    EXPECT_EQ(pick(4 * kMiB, false).algo, Algo::kNone);
    const Choice c = pick(4 * kMiB, true);
    EXPECT_NE(c.algo, Algo::kNone);
    EXPECT_EQ(c, built_in_choice(4 * kMiB, DType::kBF16, caps_of(world, true), true));
    // Where the table chose an algorithm, the same choice either way.
    EXPECT_EQ(pick(512 * kKiB, true), pick(512 * kKiB, false));
    // Past the staging buffer, nothing custom can serve.
    EXPECT_EQ(pick(8 * kMiB + 16, true).algo, Algo::kNone);
    EXPECT_NE(pick(8 * kMiB, true).algo, Algo::kNone);
  }
}

// Without a table nothing changes: the built-in bounds never hand an all-reduce that fits the
// staging buffer to NCCL (two-shot is unbounded). A pin to NCCL stays NCCL.
TEST(DeterministicSelector, AllReduceBuiltInChoiceIsUnchanged) {
  for (int world : {2, 3, 4, 8}) {
    for (std::int64_t bytes : {16 * std::int64_t{1}, 64 * kKiB, 300 * kKiB, 1 * kMiB, 8 * kMiB}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, " + std::to_string(bytes) + " bytes");
      EXPECT_EQ(
          select_all_reduce(bytes, DType::kF16, ReduceOp::kSum, caps_of(world, true), {}, nullptr),
          select_all_reduce(bytes, DType::kF16, ReduceOp::kSum, caps_of(world, false), {},
                            nullptr));
    }
  }
  EXPECT_EQ(
      select_all_reduce(kMiB, DType::kBF16, ReduceOp::kSum, caps_of(8, true), Algo::kNone, nullptr)
          .algo,
      Algo::kNone);
}

// Rows past the built-in fused bounds take the unfused pair normally, and a fused kernel in a
// deterministic group, up to what the Lamport slots hold; beyond them, nothing.
TEST(DeterministicSelector, FusedNormPastTheBoundsWithinTheWorkspace) {
  for (int world : {2, 3, 4, 8}) {
    SCOPED_TRACE(world);
    const std::int64_t slot = 8 * kMiB;
    const std::int64_t bound = std::max(info(Algo::kLamport).fused.bound(world),
                                        info(Algo::kLamportTwoShot).fused.bound(world));
    const std::int64_t rows = bound / (4096 * 2) + 1;  // just past every bound
    const char* why = nullptr;
    EXPECT_EQ(
        select_add_rmsnorm(rows, 4096, DType::kBF16, caps_of(world, false, slot), {}, nullptr, &why)
            .algo,
        Algo::kNone);
    const Choice c =
        select_add_rmsnorm(rows, 4096, DType::kBF16, caps_of(world, true, slot), {}, nullptr, &why);
    EXPECT_NE(c.algo, Algo::kNone) << (why != nullptr ? why : "");
    EXPECT_TRUE(fits(c.algo, rows * 4096 * 2, DType::kBF16, world, slot));
    // Past what any fusing algorithm's slots hold: none, saying why.
    std::int64_t most = rows;
    while (fits(Algo::kLamportTwoShot, most * 4096 * 2, DType::kBF16, world, slot) ||
           fits(Algo::kLamport, most * 4096 * 2, DType::kBF16, world, slot))
      most *= 2;
    EXPECT_EQ(
        select_add_rmsnorm(most, 4096, DType::kBF16, caps_of(world, true, slot), {}, nullptr, &why)
            .algo,
        Algo::kNone);
    EXPECT_NE(std::string(why).find("fusion workspace"), std::string::npos) << why;
  }
}

// A tuned "the unfused pair was faster" does not hand a deterministic group's fused call away.
TEST(DeterministicSelector, FusedNormTunedNoneStaysFused) {
  const TuneTable t = table_for(4, {}, {{1 * kMiB, Choice{}, 4.0}});
  EXPECT_EQ(select_add_rmsnorm(4, 4096, DType::kBF16, caps_of(4, false), {}, &t).algo, Algo::kNone);
  EXPECT_NE(select_add_rmsnorm(4, 4096, DType::kBF16, caps_of(4, true), {}, &t).algo, Algo::kNone);
}

// The fused kernels' launch shape in a deterministic group depends on the hidden size alone:
// no groups of blocks (a row's sum of squares in one order), the same threads at every batch.
TEST(DeterministicSelector, FusedLaunchShapeIsTheHiddenSizesAlone) {
  for (int world : {2, 4, 8}) {
    for (std::int64_t hidden : {2880, 4096, 7168, 8192, 16384}) {
      SCOPED_TRACE(std::to_string(world) + " ranks, hidden " + std::to_string(hidden));
      const SelectorCaps det = caps_of(world, true, 64 * kMiB);
      const Choice one = select_add_rmsnorm(1, hidden, DType::kBF16, det, {}, nullptr);
      ASSERT_NE(one.algo, Algo::kNone);
      for (std::int64_t rows : {1, 2, 3, 16, 64, 256, 1024}) {
        for (Pinned pin : {Pinned{}, Pinned{Algo::kLamport}, Pinned{Algo::kLamportTwoShot}}) {
          const Choice c = select_add_rmsnorm(rows, hidden, DType::kBF16, det, pin, nullptr);
          if (c.algo == Algo::kNone) continue;  // past the slots
          EXPECT_EQ(c.group, 1) << rows;
          EXPECT_EQ(c.threads, one.threads) << rows;
        }
      }
    }
  }
  // Normally a single wide row spreads over a group of blocks (the shape a batch changes).
  EXPECT_GT(
      select_add_rmsnorm(1, 16384, DType::kBF16, caps_of(8, false, 64 * kMiB), {}, nullptr).group,
      1);
}

/// A backend that serves everything, by its name; `invariant` is its `batch_invariant` hook.
class Named final : public Backend {
 public:
  explicit Named(std::string name, bool invariant = true)
      : name_(std::move(name)), invariant_(invariant) {}
  std::string_view name() const noexcept override { return name_; }
  Plan plan(const Request&) const noexcept override { return Plan::yes({this}); }
  Status run(const Request&, const Plan&, Stream) noexcept override { return Status::kOk; }
  bool batch_invariant() const noexcept override { return invariant_; }

 private:
  std::string name_;
  bool invariant_;
};

// What a deterministic group logs once, or refuses under strict (before launching anything):
// an all-reduce, fused norm or MoE finalize that a backend which is not batch-invariant (NCCL)
// reduces in any step of its plan; the message names the size and the custom kernels' limit.
TEST(DeterministicGroupCalls, NcclReducedCallsAreNotBatchInvariant) {
  const Named nccl("nccl", false), custom("custom_ar"), composite("all_reduce+add_rmsnorm");
  Request r;
  r.in = TensorView::flat(nullptr, DType::kBF16, 16 << 20, 0);  // 32 MiB
  const Plan on_nccl = Plan::yes({&nccl});
  const Plan on_custom = Plan::yes({&custom});
  const Plan nested = Plan::around({&composite}, on_nccl);
  for (Op op : {Op::kAllReduce, Op::kAllReduceAddRmsNorm, Op::kMoeFinalize}) {
    SCOPED_TRACE(std::string(to_string(op)));
    r.op = op;
    EXPECT_EQ(not_batch_invariant(r, on_custom, 8 * kMiB), "");
    const std::string why = not_batch_invariant(r, on_nccl, 8 * kMiB);
    EXPECT_NE(why.find("33554432 bytes"), std::string::npos) << why;
    EXPECT_NE(why.find("up to 8388608 bytes (TPCOMM_CUSTOM_AR_MAX_BYTES)"), std::string::npos)
        << why;
    EXPECT_NE(why.find("not batch-invariant"), std::string::npos) << why;
    EXPECT_NE(not_batch_invariant(r, nested, 8 * kMiB), "");
    EXPECT_NE(not_batch_invariant(r, on_nccl, 0).find("no custom all-reduce"), std::string::npos);
    const auto on_nccl_backend = [&](const Backend& b) { return &b == &nccl; };
    EXPECT_TRUE(any_step(nested, on_nccl_backend));
    EXPECT_FALSE(any_step(on_custom, on_nccl_backend));
  }
  // Other primitives have no reduction order to keep; the plain reduce-scatter is not kept.
  r.op = Op::kAllGather;
  r.args = Exchange{};
  EXPECT_EQ(not_batch_invariant(r, on_nccl, 8 * kMiB), "");
  r.op = Op::kBroadcast;
  r.args = Native{};
  EXPECT_EQ(not_batch_invariant(r, on_nccl, 8 * kMiB), "");
  r.op = Op::kReduceScatter;
  r.args = Reduce{ReduceOp::kSum, /*scattered=*/true};
  EXPECT_EQ(not_batch_invariant(r, on_nccl, 8 * kMiB), "");
}

// The policy's other conditions still decide when the group is deterministic.
TEST(DeterministicPolicy, DeterministicGroupLiftsNoOtherCondition) {
  FusionInputs in;
  in.architecture = "LlamaForCausalLM";
  in.tp_size = 8;
  in.deterministic_inference = true;
  in.deterministic_group = true;
  FusionDecision d = decide_allreduce_fusion(in);
  EXPECT_FALSE(d.enabled);
  EXPECT_NE(d.reason.find("not in the allow-list"), std::string::npos) << d.reason;
  in.architecture = "DeepseekV3ForCausalLM";
  in.fusion = Switch::kOff;
  EXPECT_FALSE(decide_allreduce_fusion(in).enabled);
  // The group alone changes nothing: an ordinary yes, its reason without the words.
  in.fusion = Switch::kAuto;
  in.deterministic_inference = false;
  d = decide_allreduce_fusion(in);
  EXPECT_TRUE(d.enabled) << d.reason;
  EXPECT_EQ(d.reason.find("deterministic"), std::string::npos) << d.reason;
}

}  // namespace
}  // namespace tpcomm
