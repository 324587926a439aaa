// SPDX-License-Identifier: Apache-2.0
// NCCL as a backend of the chain: always last, serves every collective its dtype table covers.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.hpp"
#include "backends/nccl_comm.hpp"

namespace tpcomm {

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(std::unique_ptr<NcclComm> comm) noexcept : comm_(std::move(comm)) {}

  std::string_view name() const noexcept override { return "nccl"; }
  Plan plan(const Request& request) const noexcept override;
  Status run(const Request& request, const Plan& plan, Stream stream) noexcept override;
  std::string last_error() const override { return comm_->last_error(); }

  // NOTE [backend hooks] in backends/backend.hpp. NCCL's failures come from its asynchronous
  // error or the deadline of eager work (NOTE [nccl from two threads] in nccl_comm.cpp); it
  // checks no call against the peers' and sums in an order of its own choosing.
  Status health(std::string* message) noexcept override;
  Status failure(std::string* message) noexcept override;
  void abort(bool /*any_thread*/) noexcept override { comm_->abort(); }
  /// Where the eager call NCCL last served was unfinished when it was aborted
  /// (`NcclComm::aborted_unfinished`), or is call `checked`, whose check before NCCL failed
  /// (`Options::nccl_check`), fills that call's output with the poison of its type (NOTE
  /// [poisoned outputs] in kernels/common/poison.cuh) on the call's stream, by memsets, which run
  /// once NCCL's aborted kernels have returned. Once.
  void poison_after_failure(std::uint32_t checked) noexcept override;
  /// NCCL is enabled inside a capture scope, as it was before it after.
  void begin_capture() noexcept override;
  Status end_capture(bool agreed) noexcept override;
  bool checks_calls() const noexcept override { return false; }
  bool batch_invariant() const noexcept override { return false; }
  /// One all-to-all of `bytes`, so that NCCL sets up its peer-to-peer buffers now.
  void prepare(std::int64_t bytes, Stream stream) override;

 private:
  /// `run` without the bookkeeping: the NCCL call of `request`.
  Status enqueue(const Request& request, const Plan& plan, Stream stream) noexcept;

  std::unique_ptr<NcclComm> comm_;
  // The output and stream of the last eager call (the owning thread's).
  TensorView last_out_;
  Stream last_stream_ = nullptr;
  std::uint32_t last_call_ = 0;
  // Whether NCCL was enabled before the open capture scope enabled it.
  bool enabled_before_capture_ = true;
};

}  // namespace tpcomm
