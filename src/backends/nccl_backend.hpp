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
  [[nodiscard]] NcclComm& comm() noexcept { return *comm_; }

  std::string_view name() const noexcept override { return "nccl"; }
  Plan plan(const Request& request) const noexcept override;
  Status run(const Request& request, const Plan& plan, Stream stream) noexcept override;
  std::string last_error() const override { return comm_->last_error(); }

  /// Owning thread, once the group has failed and NCCL is aborted: where the eager call NCCL
  /// last served was unfinished then (`NcclComm::aborted_unfinished`), or is call `checked`,
  /// whose check before NCCL failed (`Options::nccl_check`), fills that call's output with the
  /// poison of its type (NOTE [poisoned outputs] in kernels/common/poison.cuh) on the call's
  /// stream, by memsets, which run once NCCL's aborted kernels have returned. Once.
  void poison_after_failure(std::uint32_t checked = 0) noexcept;

 private:
  /// `run` without the bookkeeping: the NCCL call of `request`.
  Status enqueue(const Request& request, const Plan& plan, Stream stream) noexcept;

  std::unique_ptr<NcclComm> comm_;
  // The output and stream of the last eager call (the owning thread's).
  TensorView last_out_;
  Stream last_stream_ = nullptr;
  std::uint32_t last_call_ = 0;
};

}  // namespace tpcomm
