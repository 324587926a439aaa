// SPDX-License-Identifier: Apache-2.0
// What the composite paths of the chain share (docs/DESIGN.md, "The chain"): one operation they
// serve, one inner call through the chain, planned with the outer call and run as planned with
// the outer call's tag, and an error message that names the outer call.
#pragma once

#include <string>
#include <string_view>

#include "backends/backend.hpp"
#include "backends/exchange_plan.hpp"
#include "core/check.hpp"

namespace tpcomm {

class Composite : public Backend {
 public:
  /// `op` is what it serves (`serves`; `only` says so to the others); `call` names it in messages;
  /// `before` and `after` surround the inner path in `describe` ("moe_combine+", "+copy").
  Composite(BackendChain& chain, Op op, const char* only, const char* call, std::string_view before,
            std::string_view after) noexcept
      : chain_(chain), op_(op), only_(only), call_(call), before_(before), after_(after) {}

  /// Yes where the chain serves the inner call, with its plan (its steps) inside this one.
  [[nodiscard]] Plan plan(const Request& r) const noexcept final {
    if (!serves(r)) return Plan::no(only_);
    ExchangePlan scratch;
    const Plan inner = chain_.plan(planned(r, &scratch));
    if (!inner.ok()) return Plan::no(inner.refusal);
    if (inner.full()) return Plan::no("composite paths nested too deeply");
    return Plan::around({this}, inner);
  }

  [[nodiscard]] std::string describe(const Plan& plan) const final {
    return std::string(before_) + BackendChain::describe(plan.inner_plan()) + std::string(after_);
  }

  [[nodiscard]] std::string last_error() const final { return error_; }

 protected:
  /// Whether it serves `r`: the calls of its operation, unless it says otherwise.
  [[nodiscard]] virtual bool serves(const Request& r) const noexcept { return r.op == op_; }

  /// The inner call of `r` as it is planned (what it runs on may be stand-ins: plans never look
  /// at pointers); `scratch` holds its exchange plan where it needs one.
  [[nodiscard]] virtual Request planned(const Request& r, ExchangePlan* scratch) const noexcept = 0;

  /// An inner call of `outer`: `op` from `in` to `out` as the primitive `args`, in the outer
  /// call's capture and with its tag.
  [[nodiscard]] static Request inner(const Request& outer, Op op, const TensorView& in,
                                     const TensorView& out,
                                     std::variant<Reduce, Exchange, Native> args) noexcept {
    return Request{op, in, out, args, outer.capturing, outer.tag};
  }

  /// Runs `req` through the chain as `plan` planned it; the error of the backend that ran it
  /// becomes this one's.
  [[nodiscard]] Status run_inner(const Request& req, const Plan& plan, Stream stream) noexcept {
    const Backend* served = nullptr;
    const Status s = chain_.run(req, plan.inner_plan(), stream, &served);
    if (s != Status::kOk) error_ = served != nullptr ? served->last_error() : std::string();
    return s;
  }

  /// `s`, with "CALL: what" as the error.
  Status failed(Status s, const char* what) noexcept {
    error_ = detail::concat(call_, ": ", what);
    return s;
  }

 private:
  BackendChain& chain_;
  Op op_;
  const char* only_;
  const char* call_;
  std::string_view before_, after_;
  std::string error_;
};

}  // namespace tpcomm
