// SPDX-License-Identifier: Apache-2.0
// Status codes and the exception that setup code throws.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace tpcomm {

/// Result of an operation.
///
/// Hot-path calls (`Group::all_reduce` and friends) return a `Status` and never throw; setup
/// calls (constructors, handle exchange, loading NCCL) throw `Error`, which carries one.
enum class Status : int {
  kOk = 0,
  /// Not an error inside the library: "this backend cannot serve this request, try the next".
  /// Returned to a caller only when no backend at all could serve the request.
  kUnsupported,
  /// A bad argument: wrong dtype, size, shape, null pointer, rank out of range. Nothing was
  /// enqueued and the group stays usable.
  kInvalidArgument,
  /// A CUDA runtime or driver call failed.
  kCudaError,
  /// NCCL reported an error (its message is in the log and in `Group::last_error()`).
  kNcclError,
  /// A peer did not arrive within `TPCOMM_TIMEOUT_MS`. The group is unusable afterwards.
  kTimeout,
  /// The group was aborted (by `Group::abort()` or after a failure elsewhere).
  kAborted,
  /// A component is not available on this machine (no driver, no NCCL, no peer access).
  kUnavailable,
  /// An operating-system call failed (sockets, processes, files).
  kSystemError,
  /// A malformed message or file was received.
  kProtocolError,
  /// A bug in tpcomm.
  kInternal,
  /// The ranks called different collectives (another operation, count, dtype or shape) at the
  /// same point: every rank that noticed names both calls. The group is unusable afterwards.
  kMismatch,
};

/// Short stable name of a status, e.g. "timeout".
std::string_view to_string(Status s) noexcept;

/// The exception thrown by setup code. `what()` names the failed call, its file:line and the
/// underlying CUDA/NCCL/system error string.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  [[nodiscard]] Status status() const noexcept { return status_; }

 private:
  Status status_;
};

}  // namespace tpcomm
