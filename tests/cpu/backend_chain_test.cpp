// SPDX-License-Identifier: Apache-2.0
// The backend chain with fake backends: one plan per call, order, fallback on kUnsupported, real
// errors propagate, each (backend, reason) fallback logged once, composites nested in composites
// run as planned.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "core/log.hpp"
#include "ops/composite.hpp"

namespace tpcomm {
namespace {

/// A backend that answers as scripted and records what it was asked.
class FakeBackend final : public Backend {
 public:
  FakeBackend(std::string name, const char* refuse, Status result, std::vector<std::string>* trace)
      : name_(std::move(name)), refuse_(refuse), result_(result), trace_(trace) {}
  std::string_view name() const noexcept override { return name_; }
  Plan plan(const Request& r) const noexcept override {
    if (refuse_ != nullptr && r.in.numel() > 100) return Plan::no(refuse_);
    return Plan::yes({this});
  }
  Status run(const Request&, const Plan&, Stream) noexcept override {
    trace_->push_back(name_);
    return result_;
  }

 private:
  std::string name_;
  const char* refuse_;
  Status result_;
  std::vector<std::string>* trace_;
};

Request request(std::int64_t n) {
  Request r;
  r.in = TensorView::flat(reinterpret_cast<void*>(64), DType::kBF16, n);
  r.out = r.in;
  return r;
}

TEST(BackendChain, FirstSupportingBackendRuns) {
  std::vector<std::string> trace;
  BackendChain chain;
  chain.add(std::make_unique<FakeBackend>("a", "too big", Status::kOk, &trace));
  chain.add(std::make_unique<FakeBackend>("b", nullptr, Status::kOk, &trace));
  const Backend* served = nullptr;
  EXPECT_EQ(chain.run(request(10), nullptr, &served), Status::kOk);
  EXPECT_EQ(served->name(), "a");
  EXPECT_EQ(chain.run(request(1000), nullptr, &served), Status::kOk);
  EXPECT_EQ(served->name(), "b");
  EXPECT_EQ(trace, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(chain.plan(request(10)).step.backend->name(), "a");
  EXPECT_EQ(chain.plan(request(1000)).step.backend->name(), "b");
}

TEST(BackendChain, UnsupportedAtRunTimeMovesOn) {
  std::vector<std::string> trace;
  BackendChain chain;
  chain.add(std::make_unique<FakeBackend>("declines", nullptr, Status::kUnsupported, &trace));
  chain.add(std::make_unique<FakeBackend>("serves", nullptr, Status::kOk, &trace));
  const Backend* served = nullptr;
  EXPECT_EQ(chain.run(request(10), nullptr, &served), Status::kOk);
  EXPECT_EQ(served->name(), "serves");
  EXPECT_EQ(trace, (std::vector<std::string>{"declines", "serves"}));
}

TEST(BackendChain, RealErrorsPropagateWithoutFallback) {
  for (Status error : {Status::kTimeout, Status::kCudaError, Status::kNcclError,
                       Status::kInvalidArgument, Status::kAborted}) {
    std::vector<std::string> trace;
    BackendChain chain;
    chain.add(std::make_unique<FakeBackend>("fails", nullptr, error, &trace));
    chain.add(std::make_unique<FakeBackend>("never", nullptr, Status::kOk, &trace));
    const Backend* served = nullptr;
    EXPECT_EQ(chain.run(request(10), nullptr, &served), error);
    EXPECT_EQ(served->name(), "fails");
    EXPECT_EQ(trace, (std::vector<std::string>{"fails"})) << to_string(error);
  }
}

TEST(BackendChain, NothingServesIsUnsupported) {
  std::vector<std::string> trace;
  BackendChain chain;
  chain.add(std::make_unique<FakeBackend>("a", "too big", Status::kOk, &trace));
  const Backend* served = reinterpret_cast<const Backend*>(1);
  EXPECT_EQ(chain.run(request(1000), nullptr, &served), Status::kUnsupported);
  EXPECT_EQ(served, nullptr);
  EXPECT_FALSE(chain.plan(request(1000)).ok());
  EXPECT_STREQ(chain.plan(request(1000)).refusal, "too big");
  EXPECT_EQ(BackendChain::describe(chain.plan(request(1000))), "none");
  BackendChain empty;
  EXPECT_EQ(empty.run(request(1), nullptr), Status::kUnsupported);
}

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(BackendChain, EachFallbackReasonIsLoggedOnce) {
  std::vector<std::string> trace;
  BackendChain chain;
  static const char kTooBig[] = "request too big for fake";
  chain.add(std::make_unique<FakeBackend>("fake_custom", kTooBig, Status::kOk, &trace));
  chain.add(std::make_unique<FakeBackend>("fake_declines", nullptr, Status::kUnsupported, &trace));
  chain.add(std::make_unique<FakeBackend>("fake_nccl", nullptr, Status::kOk, &trace));
  const LogLevel before = log::level();
  log::set_level(LogLevel::kInfo);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) EXPECT_EQ(chain.run(request(1000), nullptr), Status::kOk);
  const std::string err = ::testing::internal::GetCapturedStderr();
  log::set_level(before);
  EXPECT_EQ(occurrences(err, kTooBig), 1u) << err;
  EXPECT_EQ(occurrences(err, "fake_declines does not serve"), 1u) << err;
  EXPECT_EQ(occurrences(err, "fake_nccl"), 0u) << err;
}

/// A composite that serves `op` by running `inner_op` through the chain (the MoE finalize's
/// combine around the fused call, the fused call's all-reduce around the local norm).
class FakeComposite final : public Composite {
 public:
  FakeComposite(BackendChain& chain, Op op, Op inner_op, std::string name,
                std::vector<std::string>* trace)
      : Composite(chain, op, "not this op", "fake", "[", "]"),
        inner_op_(inner_op),
        name_(std::move(name)),
        trace_(trace) {}
  std::string_view name() const noexcept override { return name_; }
  Status run(const Request& r, const Plan& plan, Stream stream) noexcept override {
    trace_->push_back(name_);
    return run_inner(planned(r, nullptr), plan, stream);
  }

 private:
  Request planned(const Request& r, ExchangePlan* /*scratch*/) const noexcept override {
    return inner(r, inner_op_, r.in, r.out, r.args);
  }

  Op inner_op_;
  std::string name_;
  std::vector<std::string>* trace_;
};

/// A backend that serves the all-reduce alone.
class FakeAllReduce final : public Backend {
 public:
  explicit FakeAllReduce(std::vector<std::string>* trace) : trace_(trace) {}
  std::string_view name() const noexcept override { return "leaf"; }
  Plan plan(const Request& r) const noexcept override {
    return r.op == Op::kAllReduce ? Plan::yes({this}) : Plan::no("the all-reduce alone");
  }
  Status run(const Request&, const Plan&, Stream) noexcept override {
    trace_->push_back("leaf");
    return Status::kOk;
  }

 private:
  std::vector<std::string>* trace_;
};

/// The leaf, the norm around it and the combine around that: a chain two composites deep, as the
/// MoE finalize's path where no fused kernel serves it.
void add_nested(BackendChain& chain, std::vector<std::string>* trace) {
  chain.add(std::make_unique<FakeAllReduce>(trace));
  chain.add(std::make_unique<FakeComposite>(chain, Op::kAllReduceAddRmsNorm, Op::kAllReduce, "norm",
                                            trace));
  chain.add(std::make_unique<FakeComposite>(chain, Op::kMoeFinalize, Op::kAllReduceAddRmsNorm,
                                            "combine", trace));
}

TEST(BackendChain, CompositesInCompositesRunAsPlanned) {
  std::vector<std::string> trace;
  BackendChain chain;
  add_nested(chain, &trace);
  Request r = request(10);
  r.op = Op::kMoeFinalize;
  const Plan plan = chain.plan(r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan.step.backend->name(), "combine");
  ASSERT_NE(plan.inner[0].backend, nullptr);
  EXPECT_EQ(plan.inner[0].backend->name(), "norm");
  ASSERT_NE(plan.inner[1].backend, nullptr);
  EXPECT_EQ(plan.inner[1].backend->name(), "leaf");
  const Backend* served = nullptr;
  EXPECT_EQ(chain.run(r, plan, nullptr, &served), Status::kOk);
  EXPECT_EQ(served->name(), "combine");
  EXPECT_EQ(trace, (std::vector<std::string>{"combine", "norm", "leaf"}));
  EXPECT_EQ(BackendChain::describe(plan), "[[leaf]]");
}

TEST(BackendChain, CompositesNestedTooDeeplyAreRefusedNotCut) {
  std::vector<std::string> trace;
  BackendChain chain;
  add_nested(chain, &trace);
  auto deeper =
      std::make_unique<FakeComposite>(chain, Op::kAllGather, Op::kMoeFinalize, "deeper", &trace);
  const Backend& fourth = *deeper;
  chain.add(std::move(deeper));
  Request r = request(10);
  r.op = Op::kAllGather;
  EXPECT_FALSE(chain.plan(r).ok());
  EXPECT_STREQ(fourth.plan(r).refusal, "composite paths nested too deeply");
}

}  // namespace
}  // namespace tpcomm
