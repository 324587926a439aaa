// SPDX-License-Identifier: Apache-2.0
#include "backends/nccl_lib.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/check.hpp"

namespace tpcomm {
namespace {

/// Loaded tables by path. Deliberately never destroyed: unloading NCCL at exit while a leaked
/// communicator's proxy thread still runs its code would crash the process on the way out.
struct Cache {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<NcclLib>, std::less<>> by_path;
};

Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

/// A version code in the current encoding (major * 10000 + minor * 100 + patch), whichever
/// encoding `code` uses: NCCL up to 2.8 used major * 1000 + minor * 100 + patch.
constexpr int normalized(int code) noexcept {
  if (code >= 10000) return code;
  return (code / 1000) * 10000 + ((code % 1000) / 100) * 100 + code % 100;
}

static_assert(normalized(2804) == 20804);
static_assert(normalized(22809) == 22809);
static_assert(normalized(NCCL_VERSION_CODE) >= NcclLib::kMinVersion,
              "the NCCL headers tpcomm is built against are older than the minimum it accepts");

}  // namespace

NcclLib::NcclLib(DynamicLibrary library)
    : library_(std::move(library)), resolved_path_(library_.resolved_path()) {}

std::string NcclLib::resolve() {
  std::string missing;
  int found = 0;
  int required = 0;
#define TPCOMM_NCCL_RESOLVE_REQUIRED(name)                          \
  ++required;                                                       \
  name = reinterpret_cast<decltype(&::name)>(library_.find(#name)); \
  if (name != nullptr) {                                            \
    ++found;                                                        \
  } else {                                                          \
    missing += (missing.empty() ? "" : ", ") + std::string(#name);  \
  }
  TPCOMM_NCCL_REQUIRED_SYMBOLS(TPCOMM_NCCL_RESOLVE_REQUIRED)
#undef TPCOMM_NCCL_RESOLVE_REQUIRED
  if (found == 0) {
    return detail::concat(path(), " (", resolved_path_,
                          ") is not NCCL: it does not export ncclGetVersion nor any other NCCL "
                          "entry point");
  }
  if (found < required) {
    return detail::concat(path(), " (", resolved_path_,
                          ") is not a usable NCCL library: it does not export ", missing);
  }
#define TPCOMM_NCCL_RESOLVE_OPTIONAL(name) \
  name = reinterpret_cast<decltype(&::name)>(library_.find(#name));
  TPCOMM_NCCL_OPTIONAL_SYMBOLS(TPCOMM_NCCL_RESOLVE_OPTIONAL)
#undef TPCOMM_NCCL_RESOLVE_OPTIONAL
  has_window_register = ncclCommWindowRegister != nullptr && ncclCommWindowDeregister != nullptr;
  has_mem_alloc = ncclMemAlloc != nullptr && ncclMemFree != nullptr;
  has_comm_finalize = ncclCommFinalize != nullptr;
  has_all_to_all = ncclAlltoAll != nullptr;

  int code = 0;
  if (ncclResult_t r = ncclGetVersion(&code); r != ncclSuccess) {
    return detail::concat("ncclGetVersion failed in ", resolved_path_, ": ", error_string(r));
  }
  version_ = normalized(code);
  if (version_ < kMinVersion) {
    return detail::concat("NCCL ", version_string(version_), " at ", resolved_path_,
                          " is too old: tpcomm needs ", version_string(kMinVersion),
                          " or newer (set TPCOMM_NCCL_PATH to a newer libnccl.so.2)");
  }
  return {};
}

const NcclLib* NcclLib::try_load(const std::string& path, std::string* why) noexcept {
  try {
    Cache& c = cache();
    std::lock_guard lock(c.mutex);
    if (auto it = c.by_path.find(path); it != c.by_path.end()) return it->second.get();

    std::string reason;
    std::optional<DynamicLibrary> library = DynamicLibrary::try_open(path, &reason);
    if (!library) {
      if (why != nullptr) {
        *why = detail::concat("cannot open NCCL library ", path, " (", reason,
                              "); set TPCOMM_NCCL_PATH to libnccl.so.2's path");
      }
      return nullptr;
    }
    std::unique_ptr<NcclLib> lib(new NcclLib(std::move(*library)));
    reason = lib->resolve();
    if (!reason.empty()) {
      if (why != nullptr) *why = std::move(reason);
      return nullptr;
    }
    return c.by_path.emplace(path, std::move(lib)).first->second.get();
  } catch (const std::exception& e) {
    if (why != nullptr) *why = detail::concat("cannot load NCCL from ", path, ": ", e.what());
    return nullptr;
  }
}

const NcclLib& NcclLib::load(const std::string& path) {
  std::string why;
  const NcclLib* lib = try_load(path, &why);
  if (lib == nullptr) TPCOMM_THROW(Status::kUnavailable, why);
  return *lib;
}

std::optional<ncclDataType_t> NcclLib::to_nccl(DType t) const noexcept {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI8:
      return ncclInt8;
    case DType::kU8:
      return ncclUint8;
    case DType::kI32:
      return ncclInt32;
    case DType::kU32:
      return ncclUint32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU64:
      return ncclUint64;
    case DType::kF8E4M3:
      if (supports_fp8()) return ncclFloat8e4m3;
      return std::nullopt;
    case DType::kF8E5M2:
      if (supports_fp8()) return ncclFloat8e5m2;
      return std::nullopt;
  }
  return std::nullopt;
}

ncclRedOp_t NcclLib::to_nccl(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;
}

std::string_view NcclLib::result_name(ncclResult_t r) noexcept {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      break;  // results of NCCL versions newer than these headers
  }
  return {};
}

std::string NcclLib::error_string(ncclResult_t r, ncclComm_t comm) const {
  const std::string_view name = result_name(r);
  std::string out =
      name.empty() ? detail::concat("ncclResult ", static_cast<int>(r)) : std::string(name);
  if (ncclGetErrorString != nullptr) {
    if (const char* text = ncclGetErrorString(r); text != nullptr && text[0] != '\0') {
      out += ": ";
      out += text;
    }
  }
  if (ncclGetLastError != nullptr) {
    if (const char* last = ncclGetLastError(comm); last != nullptr && last[0] != '\0') {
      out += "; last NCCL error: ";
      out += last;
    }
  }
  return out;
}

std::string NcclLib::version_string(int code) {
  const int v = normalized(code);
  return detail::concat(v / 10000, ".", (v % 10000) / 100, ".", v % 100);
}

}  // namespace tpcomm
