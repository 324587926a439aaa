// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce as a backend of the chain: the selector plans each call once.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.hpp"
#include "backends/custom_ar.hpp"

namespace tpcomm {

/// Serves the all-reduce, the fused all-reduce + residual add + RMSNorm and the exchanges with
/// the custom kernels; the pure selector (tune/selector.hpp) decides which kernel and launch
/// shape, from the group's capabilities, `TPCOMM_ALGO` and the tuned table.
class CustomArBackend final : public Backend {
 public:
  /// `table` points at the group's current tuned table (null: the built-in choice), which
  /// `Group::tune` may replace. `pinned` and `pinned_exchange`: what `TPCOMM_ALGO` and
  /// `TPCOMM_EXCHANGE_ALGO` say. `lm_head`: the LM-head exchange is served here
  /// (`TPCOMM_LM_HEAD_A2A`). `moe_prologue`: the MoE finalize's combine runs as a prologue of
  /// the fused kernel here (`TPCOMM_MOE_PROLOGUE=1`); otherwise the combine kernel runs first
  /// (`make_moe_combine_backend`, ops/moe.hpp).
  CustomArBackend(std::unique_ptr<CustomAllReduce> ar, Pinned pinned,
                  PinnedExchange pinned_exchange, const TuneTable* const* table, bool lm_head,
                  bool moe_prologue) noexcept
      : ar_(std::move(ar)),
        pinned_(pinned),
        pinned_exchange_(pinned_exchange),
        table_(table),
        lm_head_(lm_head),
        moe_prologue_(moe_prologue) {}

  std::string_view name() const noexcept override { return "custom_ar"; }
  Plan plan(const Request& request) const noexcept override;
  Status run(const Request& request, const Plan& plan, Stream stream) noexcept override;
  std::string describe(const Plan& plan) const override;
  std::string last_error() const override { return ar_->error_message(); }

  // NOTE [backend hooks] in backends/backend.hpp.
  Status health(std::string* message) noexcept override;
  Status failure(std::string* message) noexcept override { return ar_->kernel_failure(message); }
  void abort(bool any_thread) noexcept override {
    if (any_thread) {
      ar_->abort_kernels();
    } else {
      ar_->abort();
    }
  }
  Status warm_up(Stream stream) noexcept override { return ar_->warm_up(stream); }
  void begin_capture() noexcept override { ar_->begin_capture(); }
  Status end_capture(bool agreed) noexcept override {
    return agreed ? ar_->end_capture() : Status::kOk;
  }
  Status check_call(const CallTag& tag, Stream stream) noexcept override {
    return ar_->check_call(tag, stream);
  }
  std::int64_t invariant_max_bytes() const noexcept override { return ar_->caps().max_bytes; }
  void prepare(std::int64_t bytes, Stream) override { ar_->prepare_exchange(bytes); }
  std::optional<TuneTable> tune(const TuneKey& key) override { return ar_->tune(key); }

 private:
  std::unique_ptr<CustomAllReduce> ar_;
  Pinned pinned_;
  PinnedExchange pinned_exchange_;
  const TuneTable* const* table_;
  bool lm_head_;
  bool moe_prologue_;
};

}  // namespace tpcomm
