// SPDX-License-Identifier: Apache-2.0
// A collective call once its operation has checked it: the request that the chain plans, and
// what the request points at. Every operation is check → plan → run: the functions of ops/ check
// a call and make its request (pure, rank-invariant except for the pointers), the group's chain
// plans it once and runs the plan (docs/DESIGN.md).
#pragma once

#include <optional>
#include <string>

#include "backends/backend.hpp"
#include "backends/exchange_plan.hpp"
#include "ops/fused_norm.hpp"

namespace tpcomm {

/// What the operations' checks need of the group that makes the call.
struct GroupShape {
  int world = 1;
  int rank = 0;
  int device = 0;
};

/// A checked call. Not copyable: `request` points into it (`exchange`, `norm`).
struct Call {
  Call() = default;
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  Request request;
  /// The exchanges' regions (the request's `Exchange::plan` points here where the custom kernels
  /// may serve).
  /// Made only by the operations that need them: a call is made on every collective.
  std::optional<ExchangePlan> exchange;
  /// The fused norm's arguments (the request's `Reduce::fusion` points at `norm->fusion`).
  std::optional<AddRmsNormCall> norm;
  /// The MoE combine's arguments (the request's `Reduce::moe` points here).
  std::optional<kernels::MoeCombineParams> moe;
  /// Why the checks refused the call.
  std::string message;
  /// Checked, and nothing to do on any rank (no elements anywhere): no collective is run.
  bool empty = false;
};

/// kInvalidArgument, with `message` kept in `call`.
Status refuse(Call* call, std::string message) noexcept;

/// Checks that `v`, the `what` of operation `op`, is usable on the group's device: not null
/// while it has elements, contiguous, on `shape.device` (or on no device known).
Status check_view(const GroupShape& shape, const TensorView& v, const char* what, const char* op,
                  Call* call) noexcept;

/// Shape rules shared by the collectives: `out` holds `out_factor` x and `in` holds `in_factor` x
/// some common number of elements, with one dtype; both pass `check_view`.
Status check_pair(const GroupShape& shape, const TensorView& in, const TensorView& out,
                  std::int64_t in_factor, std::int64_t out_factor, const char* op,
                  Call* call) noexcept;

}  // namespace tpcomm
