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

 private:
  std::unique_ptr<NcclComm> comm_;
};

}  // namespace tpcomm
