// SPDX-License-Identifier: Apache-2.0
// The backend chain with fake backends: one plan per call, order, fallback on kUnsupported, real
// errors propagate, each (backend, reason) fallback logged once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "core/log.hpp"

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

}  // namespace
}  // namespace tpcomm
