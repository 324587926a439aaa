// SPDX-License-Identifier: Apache-2.0
// NVML (the driver's management library), loaded lazily with dlopen("libnvidia-ml.so.1"):
// NVLink topology for `tpcomm info` and topology checks. Optional everywhere: a machine without
// NVML (containers often lack it) loses the NVLink columns, nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace tpcomm {

// <nvml.h> ships with the driver's development files, not with the CUDA toolkit that tpcomm
// builds against, so the few types used here are declared with NVML's layouts and values
// (NVML keeps them ABI-stable; versioned entry points such as `_v2` are named explicitly).
// tpcomm's own names keep them apart from <nvml.h>'s should a file include both.
namespace nvml {

/// nvmlReturn_t.
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;

/// nvmlDevice_t.
struct DeviceSt;
using Device = DeviceSt*;

/// nvmlEnableState_t.
enum class EnableState : int { kDisabled = 0, kEnabled = 1 };

/// nvmlPciInfo_t, as the `_v2`/`_v3` entry points fill it.
struct PciInfo {
  char bus_id_legacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pci_device_id;
  unsigned int pci_subsystem_id;
  char bus_id[32];
};
static_assert(sizeof(PciInfo) == 68 && std::is_trivially_copyable_v<PciInfo>);

/// nvmlGpuP2PCapsIndex_t.
enum class P2PCapsIndex : int { kRead = 0, kWrite = 1, kNvLink = 2, kAtomics = 3, kProp = 4 };
/// nvmlGpuP2PStatus_t.
enum class P2PStatus : int {
  kOk = 0,
  kChipsetNotSupported = 1,
  kGpuNotSupported = 2,
  kIohTopologyNotSupported = 3,
  kDisabledByRegkey = 4,
  kNotSupported = 5,
  kUnknown = 6,
};

/// NVML_NVLINK_MAX_LINKS: link indices are 0 .. kMaxLinks - 1.
inline constexpr unsigned int kMaxLinks = 18;

}  // namespace nvml

// X(name, function type): every NVML entry point tpcomm uses; all exist in every driver that
// supports the GPUs tpcomm targets.
#define TPCOMM_NVML_SYMBOLS(X)                                                                     \
  X(nvmlInit_v2, nvml::Return())                                                                   \
  X(nvmlErrorString, const char*(nvml::Return))                                                    \
  X(nvmlSystemGetDriverVersion, nvml::Return(char*, unsigned int))                                 \
  X(nvmlDeviceGetCount_v2, nvml::Return(unsigned int*))                                            \
  X(nvmlDeviceGetHandleByPciBusId_v2, nvml::Return(const char*, nvml::Device*))                    \
  X(nvmlDeviceGetNvLinkState, nvml::Return(nvml::Device, unsigned int, nvml::EnableState*))        \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, nvml::Return(nvml::Device, unsigned int, nvml::PciInfo*)) \
  X(nvmlDeviceGetP2PStatus,                                                                        \
    nvml::Return(nvml::Device, nvml::Device, nvml::P2PCapsIndex, nvml::P2PStatus*))

/// A PCI address; `function` is ignored by comparisons of GPUs.
struct PciAddress {
  std::uint32_t domain = 0;
  std::uint32_t bus = 0;
  std::uint32_t device = 0;
  std::uint32_t function = 0;
  friend bool operator==(const PciAddress&, const PciAddress&) = default;
};

/// Parses a PCI bus id as CUDA ("0000:3b:00.0") or NVML ("00000000:3B:00.0") print it, or
/// without domain ("3b:00.0", domain 0); hexadecimal, any case. nullopt when malformed.
std::optional<PciAddress> parse_pci_bus_id(std::string_view text) noexcept;

/// Function table of NVML. Obtain it with `Nvml::try_get()`.
struct Nvml {
#define TPCOMM_NVML_DECLARE_FN(name, type) std::add_pointer_t<type> name = nullptr;
  TPCOMM_NVML_SYMBOLS(TPCOMM_NVML_DECLARE_FN)
#undef TPCOMM_NVML_DECLARE_FN

  /// The process-wide table, loaded and `nvmlInit`-ed on first use, or nullptr when NVML is
  /// absent or unusable; then `why` (when not null) gets a phrase that reads after "NVML: ":
  /// "not found (<dlerror text>)", "too old (lacks nvmlX)", "nvmlInit failed (...)".
  /// Thread-safe (NVML itself is).
  static const Nvml* try_get(std::string* why = nullptr) noexcept;

  /// "Not Supported (3)".
  [[nodiscard]] std::string error_string(nvml::Return r) const;
  /// The driver's version ("580.65.06"), or empty when NVML cannot say.
  [[nodiscard]] std::string driver_version() const;
  /// The GPU at `bus_id` (any format `parse_pci_bus_id` accepts), or nullopt.
  [[nodiscard]] std::optional<nvml::Device> device(const std::string& bus_id) const noexcept;
  /// Number of active NVLink links of `d` (0 without NVLink).
  [[nodiscard]] int active_links(nvml::Device d) const noexcept;
  /// Whether NVML reports NVLink peer-to-peer between `a` and `b`; nullopt when it cannot say.
  [[nodiscard]] std::optional<bool> nvlink_p2p(nvml::Device a, nvml::Device b) const noexcept;
  /// NVLink links from the GPU at `from` towards the GPU at `to`: the active links of `from`
  /// whose far end is `to`; when none ends there but NVML reports NVLink P2P between the two
  /// (an NVSwitch system, where every link ends at a switch), all active links of `from`, as
  /// `nvidia-smi topo -m` counts them. 0 without an NVLink path; nullopt when NVML cannot
  /// find either GPU.
  [[nodiscard]] std::optional<int> links_between(const std::string& from,
                                                 const std::string& to) const noexcept;
};

}  // namespace tpcomm
