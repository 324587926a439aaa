// SPDX-License-Identifier: Apache-2.0
#include "core/nvml.hpp"

#include <charconv>
#include <optional>

#include "core/check.hpp"
#include "core/dl.hpp"

namespace tpcomm {
namespace {

struct Loaded {
  std::optional<DynamicLibrary> lib;
  Nvml table;
  std::string error;  // empty when loaded
};

Loaded load() {
  Loaded out;
  std::string why;
  out.lib = DynamicLibrary::try_open("libnvidia-ml.so.1", &why);
  if (!out.lib) {
    out.error = "not found (" + why + ")";
    return out;
  }
#define TPCOMM_NVML_RESOLVE(name, type)                                              \
  out.table.name = reinterpret_cast<std::add_pointer_t<type>>(out.lib->find(#name)); \
  if (out.table.name == nullptr) {                                                   \
    out.error = "too old (lacks " #name ")";                                         \
    return out;                                                                      \
  }
  TPCOMM_NVML_SYMBOLS(TPCOMM_NVML_RESOLVE)
#undef TPCOMM_NVML_RESOLVE
  if (nvml::Return r = out.table.nvmlInit_v2(); r != nvml::kSuccess) {
    out.error = "nvmlInit failed (" + out.table.error_string(r) + ")";
  }
  return out;
}

/// Parses `text` as one hexadecimal field of at most `max_digits` digits.
std::optional<std::uint32_t> hex_field(std::string_view text, std::size_t max_digits) noexcept {
  if (text.empty() || text.size() > max_digits) return std::nullopt;
  std::uint32_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 16);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<PciAddress> parse_pci_bus_id(std::string_view text) noexcept {
  // [domain:]bus:device.function
  const auto dot = text.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto function = hex_field(text.substr(dot + 1), 1);
  std::string_view head = text.substr(0, dot);
  const auto last_colon = head.rfind(':');
  if (last_colon == std::string_view::npos) return std::nullopt;
  const auto device = hex_field(head.substr(last_colon + 1), 2);
  head = head.substr(0, last_colon);
  std::optional<std::uint32_t> domain = 0;
  if (const auto colon = head.rfind(':'); colon != std::string_view::npos) {
    domain = hex_field(head.substr(0, colon), 8);
    head = head.substr(colon + 1);
  }
  const auto bus = hex_field(head, 2);
  if (!function || !device || !bus || !domain || *device > 0x1f || *function > 7) {
    return std::nullopt;
  }
  return PciAddress{*domain, *bus, *device, *function};
}

const Nvml* Nvml::try_get(std::string* why) noexcept {
  static const Loaded l = load();
  if (!l.error.empty()) {
    if (why != nullptr) *why = l.error;
    return nullptr;
  }
  return &l.table;
}

std::string Nvml::error_string(nvml::Return r) const {
  const char* text = nvmlErrorString != nullptr ? nvmlErrorString(r) : nullptr;
  return detail::concat(text != nullptr ? text : "unknown NVML error", " (", r, ")");
}

std::string Nvml::driver_version() const {
  char buffer[96] = {};
  if (nvmlSystemGetDriverVersion(buffer, sizeof(buffer)) != nvml::kSuccess) return {};
  return buffer;
}

std::optional<nvml::Device> Nvml::device(const std::string& bus_id) const noexcept {
  nvml::Device d = nullptr;
  if (nvmlDeviceGetHandleByPciBusId_v2(bus_id.c_str(), &d) != nvml::kSuccess) return std::nullopt;
  return d;
}

int Nvml::active_links(nvml::Device d) const noexcept {
  int n = 0;
  for (unsigned int link = 0; link < nvml::kMaxLinks; ++link) {
    auto state = nvml::EnableState::kDisabled;
    // Links past the GPU's count, or a GPU without NVLink, report an error: not active.
    if (nvmlDeviceGetNvLinkState(d, link, &state) == nvml::kSuccess &&
        state == nvml::EnableState::kEnabled) {
      ++n;
    }
  }
  return n;
}

std::optional<bool> Nvml::nvlink_p2p(nvml::Device a, nvml::Device b) const noexcept {
  auto status = nvml::P2PStatus::kUnknown;
  if (nvmlDeviceGetP2PStatus(a, b, nvml::P2PCapsIndex::kNvLink, &status) != nvml::kSuccess) {
    return std::nullopt;
  }
  return status == nvml::P2PStatus::kOk;
}

std::optional<int> Nvml::links_between(const std::string& from,
                                       const std::string& to) const noexcept {
  const auto a = device(from);
  const auto b = device(to);
  const auto to_address = parse_pci_bus_id(to);
  if (!a || !b || !to_address) return std::nullopt;
  int direct = 0;
  for (unsigned int link = 0; link < nvml::kMaxLinks; ++link) {
    auto state = nvml::EnableState::kDisabled;
    if (nvmlDeviceGetNvLinkState(*a, link, &state) != nvml::kSuccess ||
        state != nvml::EnableState::kEnabled) {
      continue;
    }
    nvml::PciInfo remote{};
    if (nvmlDeviceGetNvLinkRemotePciInfo_v2(*a, link, &remote) != nvml::kSuccess) continue;
    if (remote.domain == to_address->domain && remote.bus == to_address->bus &&
        remote.device == to_address->device) {
      ++direct;
    }
  }
  if (direct > 0) return direct;
  if (nvlink_p2p(*a, *b).value_or(false)) return active_links(*a);
  return 0;
}

}  // namespace tpcomm
