// SPDX-License-Identifier: Apache-2.0
// NCCL, loaded at run time with dlopen. tpcomm compiles against <nccl.h> for its types and
// prototypes only and never links libnccl, so a missing or old NCCL is a clear error (or, for
// `tpcomm info`, a line of output), never a loader failure. Each symbol is named once below.
#pragma once

#include <nccl.h>

#include <optional>
#include <string>
#include <string_view>

#include "core/dl.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

// X(name): entry points without which tpcomm cannot use NCCL at all. All exist since 2.14.
#define TPCOMM_NCCL_REQUIRED_SYMBOLS(X) \
  X(ncclGetVersion)                     \
  X(ncclGetUniqueId)                    \
  X(ncclCommInitRankConfig)             \
  X(ncclCommDestroy)                    \
  X(ncclCommAbort)                      \
  X(ncclCommGetAsyncError)              \
  X(ncclGetErrorString)                 \
  X(ncclGetLastError)                   \
  X(ncclCommCount)                      \
  X(ncclCommUserRank)                   \
  X(ncclAllReduce)                      \
  X(ncclAllGather)                      \
  X(ncclReduceScatter)                  \
  X(ncclBroadcast)                      \
  X(ncclSend)                           \
  X(ncclRecv)                           \
  X(ncclGroupStart)                     \
  X(ncclGroupEnd)

// X(name): entry points of newer NCCL versions; a missing one leaves its pointer null and its
// capability flag false. Window registration appeared in 2.27, ncclMemAlloc in 2.19,
// ncclAlltoAll in 2.28.
#define TPCOMM_NCCL_OPTIONAL_SYMBOLS(X) \
  X(ncclCommWindowRegister)             \
  X(ncclCommWindowDeregister)           \
  X(ncclMemAlloc)                       \
  X(ncclMemFree)                        \
  X(ncclCommFinalize)                   \
  X(ncclAlltoAll)

/// NCCL's function table, loaded from one library path. Obtain it with `NcclLib::load`; the
/// table lives until the process exits (NCCL is never unloaded: communicators and their proxy
/// threads may outlive any owner we could name). Immutable after loading, so it may be used
/// from any thread.
class NcclLib {
 public:
  /// Oldest NCCL accepted: 2.18.0. Non-blocking communicators, `ncclCommInitRankConfig` and
  /// `ncclCommFinalize` (all from 2.14) had matured by then; older releases are refused
  /// rather than trusted untested.
  static constexpr int kMinVersion = 21800;
  /// First version with the fp8 types `ncclFloat8e4m3` / `ncclFloat8e5m2`.
  static constexpr int kFp8Version = 22400;

#define TPCOMM_NCCL_DECLARE_FN(name) decltype(&::name) name = nullptr;
  TPCOMM_NCCL_REQUIRED_SYMBOLS(TPCOMM_NCCL_DECLARE_FN)
  TPCOMM_NCCL_OPTIONAL_SYMBOLS(TPCOMM_NCCL_DECLARE_FN)
#undef TPCOMM_NCCL_DECLARE_FN

  /// Both `ncclCommWindowRegister` and `ncclCommWindowDeregister` are present.
  bool has_window_register = false;
  /// Both `ncclMemAlloc` and `ncclMemFree` are present.
  bool has_mem_alloc = false;
  bool has_comm_finalize = false;
  /// `ncclAlltoAll` is present; without it all-to-all is grouped `ncclSend`/`ncclRecv`.
  bool has_all_to_all = false;

  /// The table for `path` (a soname such as "libnccl.so.2" or a file path), loaded on the
  /// first call for that path and cached for the life of the process; thread-safe. Throws
  /// `Error(kUnavailable)` when the library cannot be opened (with dlerror()'s text), is not
  /// NCCL at all, lacks a required symbol (all missing ones are named), or is older than
  /// `kMinVersion`. A failed load is not cached: a later call tries again.
  static const NcclLib& load(const std::string& path);
  /// Like `load` but returns nullptr and stores the reason in `why` instead of throwing. The
  /// reason reads on its own: "cannot open NCCL library libnccl.so.2 (<dlerror text>); ...".
  static const NcclLib* try_load(const std::string& path, std::string* why = nullptr) noexcept;

  NcclLib(const NcclLib&) = delete;
  NcclLib& operator=(const NcclLib&) = delete;

  /// The path given to `load`.
  [[nodiscard]] const std::string& path() const noexcept { return library_.path(); }
  /// The file the dynamic loader opened for `path()`.
  [[nodiscard]] const std::string& resolved_path() const noexcept { return resolved_path_; }
  /// The version code from `ncclGetVersion`, in the current encoding (22809 for 2.28.9).
  [[nodiscard]] int version() const noexcept { return version_; }
  /// "2.28.9".
  [[nodiscard]] std::string version_string() const { return version_string(version_); }
  /// True when the loaded NCCL has the fp8 data types.
  [[nodiscard]] bool supports_fp8() const noexcept { return version_ >= kFp8Version; }

  /// NCCL's data type for `t`, or nullopt when the loaded NCCL has none (fp8 before 2.24).
  [[nodiscard]] std::optional<ncclDataType_t> to_nccl(DType t) const noexcept;
  /// NCCL's reduction operator for `op` (all exist in every supported version).
  static ncclRedOp_t to_nccl(ReduceOp op) noexcept;

  /// "ncclInvalidArgument: invalid argument (...); last NCCL error: <ncclGetLastError>" —
  /// the result's name, NCCL's description of it, and NCCL's last detailed message when it has
  /// one. `comm` may be null.
  [[nodiscard]] std::string error_string(ncclResult_t r, ncclComm_t comm = nullptr) const;

  /// "2.28.9" for a version code, in either of NCCL's encodings (2.8.4 is 2804, 2.28.9 is
  /// 22809).
  static std::string version_string(int code);
  /// The symbolic name of a result ("ncclInProgress"); empty for values these headers do not
  /// know.
  static std::string_view result_name(ncclResult_t r) noexcept;

 private:
  explicit NcclLib(DynamicLibrary library);
  /// Resolves the symbols and checks the version; an empty string on success, else the reason.
  std::string resolve();

  DynamicLibrary library_;
  std::string resolved_path_;
  int version_ = 0;
};

}  // namespace tpcomm
