// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench --audit`: where the built-in choice is slower than another path the group can
// take. Pure host code over the bench's recorded rows, so that recorded tables can be checked.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tpcomm::tools {

/// The margin a loss must exceed: the larger of `kAuditMarginRatio` of the fastest path's time
/// and `kAuditMarginUs`.
inline constexpr double kAuditMarginRatio = 0.03;
inline constexpr double kAuditMarginUs = 0.2;

/// The comparison of one point: the built-in choice against the fastest path.
struct AuditPoint {
  std::string op;
  std::int64_t size = 0;
  int world_size = 0;
  std::string builtin_path;  // what served the `auto` row ("custom_ar:one_shot", ...)
  double builtin_us = 0;     // the `auto` row's median over repeats
  std::string best_algo;     // the fastest row's `--algo` name; "auto" where that is the fastest
  std::string best_path;
  double best_us = 0;
  /// Slower than the fastest by more than the margin, on another path (the same path pinned
  /// runs the same kernel and launch shape: the difference is noise).
  bool loss = false;

  [[nodiscard]] double margin_us() const noexcept { return builtin_us - best_us; }
  [[nodiscard]] double ratio() const noexcept { return builtin_us / best_us; }
};

/// True for the rows that are paths a group can take for its operation: not the peers and limits
/// the bench puts beside them (`nccl_direct`, `memcpy`, the plain all-reduce of a fused
/// operation, the all-reduce form of the sequence-parallel one).
[[nodiscard]] bool audited_algo(const std::string& algo) noexcept;

/// Every point of `rows` (the bench's JSON rows, `auto` among them, repeats allowed: each row
/// and size's out-of-place times are reduced to their median) with its comparison. Rows that
/// failed or did not run are left out; a point without an `auto` time is left out.
std::vector<AuditPoint> audit_points(const nlohmann::json& rows);

/// The points of `audit_points(rows)` that are losses.
std::vector<AuditPoint> audit_losses(const nlohmann::json& rows);

}  // namespace tpcomm::tools
