// SPDX-License-Identifier: Apache-2.0
#include "core/cuda_driver.hpp"

#include <optional>

#include "core/check.hpp"
#include "core/dl.hpp"

namespace tpcomm {
namespace {

#define TPCOMM_STRINGIFY_(x) #x
#define TPCOMM_STRINGIFY(x) TPCOMM_STRINGIFY_(x)

struct Loaded {
  std::optional<DynamicLibrary> lib;
  CudaDriver table;
  std::string error;  // empty when loaded
};

Loaded load() {
  Loaded out;
  std::string why;
  out.lib = DynamicLibrary::try_open("libcuda.so.1", &why);
  if (!out.lib) {
    out.error = "not found (" + why + ")";
    return out;
  }
  const DynamicLibrary& lib = *out.lib;
#define TPCOMM_RESOLVE(name)                                                              \
  out.table.name = reinterpret_cast<decltype(&::name)>(lib.find(TPCOMM_STRINGIFY(name))); \
  if (out.table.name == nullptr) {                                                        \
    out.error = "too old (lacks " TPCOMM_STRINGIFY(name) ")";                             \
    return out;                                                                           \
  }
  TPCOMM_CUDA_DRIVER_SYMBOLS(TPCOMM_RESOLVE)
#undef TPCOMM_RESOLVE
  if (CUresult r = out.table.cuInit(0); r != CUDA_SUCCESS) {
    out.error = "cuInit failed (" + out.table.error_string(r) + ")";
  }
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const CudaDriver* CudaDriver::try_get(std::string* why) noexcept {
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    if (why != nullptr) *why = l.error;
    return nullptr;
  }
  return &l.table;
}

const CudaDriver& CudaDriver::get() {
  std::string why;
  const CudaDriver* d = try_get(&why);
  if (d == nullptr) TPCOMM_THROW(Status::kUnavailable, "CUDA driver: ", why);
  return *d;
}

std::string CudaDriver::error_string(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName != nullptr) cuGetErrorName(r, &name);
  if (cuGetErrorString != nullptr) cuGetErrorString(r, &text);
  return std::string(name ? name : "CUDA_ERROR_UNKNOWN") + ": " +
         (text ? text : "unknown driver error " + std::to_string(static_cast<int>(r)));
}

}  // namespace tpcomm
