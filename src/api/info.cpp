// SPDX-License-Identifier: Apache-2.0
// The report of `tpcomm info` (and of `tpcomm_info` in the C API): how tpcomm was built, what
// this machine has (driver, GPUs, peer access and NVLink, NCCL) and which backends it can
// therefore use. Everything GPU-related goes through the lazily loaded driver, NVML and NCCL
// tables, so it runs on a machine with none of them.
#include <cuda.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "api/info.hpp"
#include "backends/nccl_lib.hpp"
#include "core/check.hpp"
#include "core/cuda_driver.hpp"
#include "core/nvml.hpp"
#include "core/parse.hpp"
#include "ipc/layout.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tune/algorithms.hpp"

#ifndef TPCOMM_CUDA_ARCHITECTURES
#define TPCOMM_CUDA_ARCHITECTURES "unknown"
#endif

namespace tpcomm {
namespace {

using nlohmann::json;

struct BuildInfo {
  std::string version = TPCOMM_VERSION;
  std::string compiler =
#if defined(__clang__)
      "clang " __clang_version__;
#elif defined(__GNUC__)
      "GCC " __VERSION__;
#else
      "unknown";
#endif
  long cxx_standard = __cplusplus;
  /// CUDA_VERSION of the toolkit's cuda.h: 13000 is 13.0.
  int cuda_toolkit = CUDA_VERSION;
  std::string cuda_architectures = TPCOMM_CUDA_ARCHITECTURES;
  std::string nccl_headers = detail::concat(NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH);
};

struct GpuInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  std::int64_t memory_bytes = 0;
  std::string pci_bus_id;
  int cc_major = 0;
  int cc_minor = 0;
};

struct PeerInfo {
  int from = 0;
  int to = 0;
  bool can_access = false;
  int access_supported = 0;
  int performance_rank = 0;
  /// NVLink links from `from` towards `to`; nullopt when NVML cannot say.
  std::optional<int> nvlinks;
};

struct BackendInfo {
  std::string name;
  bool usable = false;
  std::string note;
};

struct LamportWorkspace {
  int world_size = 0;
  std::int64_t slot_bytes = 0;
  std::int64_t bytes_per_rank = 0;  // kLamportBuffers x world size x slot: peer memory
};

struct Knob {
  std::string variable;
  std::string value;
};

struct Report {
  BuildInfo build;

  bool driver_available = false;
  std::string driver_reason;
  int driver_version = 0;
  std::string nvidia_driver;
  std::vector<GpuInfo> gpus;
  std::vector<PeerInfo> peers;

  bool nvml_available = false;
  std::string nvml_reason;

  bool nccl_available = false;
  std::string nccl_reason;
  std::string nccl_path;
  std::string nccl_resolved_path;
  std::string nccl_version;
  int nccl_version_code = 0;
  bool nccl_window_register = false;
  bool nccl_mem_alloc = false;
  bool nccl_comm_finalize = false;
  bool nccl_all_to_all = false;
  bool nccl_fp8 = false;

  std::vector<BackendInfo> backends;

  std::vector<Knob> knobs;
  /// The Lamport workspace the knobs give at 2, 4 and 8 ranks (`lamport_slot_bytes`).
  std::vector<LamportWorkspace> lamport;
  /// One message per TPCOMM_* variable that could not be parsed; those knobs show defaults.
  std::vector<std::string> knobs_errors;
};

/// "13.0" for a CUDA version code (13000).
std::string cuda_version_string(int code) {
  return detail::concat(code / 1000, ".", (code % 1000) / 10);
}

std::string gib(std::int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1 << 30) << " GiB";
  return os.str();
}

/// Every knob of `knob_names()` (the one list), in its order, with its value under `o`.
std::vector<Knob> knobs_of(const Options& o) {
  const std::map<std::string_view, std::string> values{
      {"TPCOMM_LOG", std::string(to_string(o.log_level))},
      {"TPCOMM_NCCL_PATH", o.nccl_path},
      {"TPCOMM_TIMEOUT_MS", std::to_string(o.timeout_ms)},
      {"TPCOMM_ALGO", o.algo},
      {"TPCOMM_EXCHANGE_ALGO", o.exchange_algo},
      {"TPCOMM_TUNE_FILE", o.tune_file.empty() ? "(default location)" : o.tune_file},
      {"TPCOMM_CUSTOM_AR_MAX_BYTES", format_bytes(o.custom_ar_max_bytes)},
      {"TPCOMM_CUSTOM_AR_REGISTER_BYTES", format_bytes(o.custom_ar_register_min_bytes)},
      {"TPCOMM_LAMPORT_MAX_BYTES", format_bytes(o.lamport_max_bytes)},
      {"TPCOMM_FUSION_MAX_TOKENS", std::to_string(o.fusion_max_tokens)},
      {"TPCOMM_FUSION_HIDDEN", std::to_string(o.fusion_hidden)},
      {"TPCOMM_DISABLE_CUSTOM_AR", o.disable_custom_ar ? "1" : "0"},
      {"TPCOMM_DISABLE_NCCL", o.disable_nccl ? "1" : "0"},
      {"TPCOMM_PDL", o.programmatic_launch ? "1" : "0"},
      {"TPCOMM_RANK_WATCH", o.rank_watch ? "1" : "0"},
      {"TPCOMM_HEARTBEAT_TIMEOUT_MS", std::to_string(o.heartbeat_timeout_ms)},
      {"TPCOMM_ASYNC_ERROR_HANDLING", std::string(to_string(o.failure_mode))},
      {"TPCOMM_LM_HEAD_A2A", std::string(to_string(o.lm_head_a2a))},
      {"TPCOMM_MOE_PROLOGUE", std::string(to_string(o.moe_prologue))},
      {"TPCOMM_NCCL_CHECK", std::string(to_string(o.nccl_check))},
      // The token is a secret: say whether it is set, never what it is.
      {"TPCOMM_STORE_TOKEN",
       o.store_token.empty() || !o.store_token_file.empty() ? "(unset)" : "(set)"},
      {"TPCOMM_STORE_TOKEN_FILE", o.store_token_file.empty() ? "(unset)" : o.store_token_file},
      {"TPCOMM_STORE_BIND", o.store_bind.empty() ? "(default)" : o.store_bind},
      {"TPCOMM_STORE_REQUIRE_TOKEN", o.store_require_token ? "1" : "0"},
      {"TPCOMM_DETERMINISTIC", std::string(to_string(o.deterministic))},
  };
  std::vector<Knob> knobs;
  for (const std::string_view name : knob_names()) {
    const auto it = values.find(name);
    knobs.push_back({std::string(name), it != values.end() ? it->second : "(not shown)"});
  }
  return knobs;
}

void collect_gpus(const CudaDriver& drv, const Nvml* nvml, Report& r) {
  int count = 0;
  if (drv.cuDeviceGetCount(&count) != CUDA_SUCCESS) count = 0;
  std::vector<CUdevice> devices;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    // Stopping at the first failure keeps GPU indices and positions equal.
    if (drv.cuDeviceGet(&dev, i) != CUDA_SUCCESS) break;
    GpuInfo g;
    g.index = i;
    char name[256] = {};
    if (drv.cuDeviceGetName(name, sizeof(name), dev) == CUDA_SUCCESS) g.name = name;
    drv.cuDeviceGetAttribute(&g.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    drv.cuDeviceGetAttribute(&g.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    drv.cuDeviceGetAttribute(&g.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    std::size_t bytes = 0;
    if (drv.cuDeviceTotalMem(&bytes, dev) == CUDA_SUCCESS) {
      g.memory_bytes = static_cast<std::int64_t>(bytes);
    }
    char bus_id[32] = {};
    if (drv.cuDeviceGetPCIBusId(bus_id, sizeof(bus_id), dev) == CUDA_SUCCESS) {
      g.pci_bus_id = bus_id;
    }
    r.gpus.push_back(std::move(g));
    devices.push_back(dev);
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < devices.size(); ++j) {
      if (i == j) continue;
      PeerInfo p;
      p.from = r.gpus[i].index;
      p.to = r.gpus[j].index;
      int can = 0;
      if (drv.cuDeviceCanAccessPeer(&can, devices[i], devices[j]) == CUDA_SUCCESS) {
        p.can_access = can != 0;
      }
      drv.cuDeviceGetP2PAttribute(&p.access_supported, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED,
                                  devices[i], devices[j]);
      drv.cuDeviceGetP2PAttribute(&p.performance_rank, CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                                  devices[i], devices[j]);
      if (nvml != nullptr) {
        p.nvlinks = nvml->links_between(r.gpus[i].pci_bus_id, r.gpus[j].pci_bus_id);
      }
      r.peers.push_back(p);
    }
  }
}

void decide_backends(const Options& options, Report& r) {
  const int gpus = static_cast<int>(r.gpus.size());
  BackendInfo nccl{.name = "nccl", .usable = false, .note = {}};
  if (options.disable_nccl) {
    nccl.note = "disabled by TPCOMM_DISABLE_NCCL";
  } else if (!r.nccl_available) {
    nccl.note = "NCCL could not be loaded (see the NCCL section)";
  } else if (gpus == 0) {
    nccl.note = "NCCL " + r.nccl_version + " loads, but there is no usable GPU";
  } else if (gpus == 1) {
    nccl.usable = true;
    nccl.note = "world size 1 only: NCCL refuses two ranks on one GPU";
  } else {
    nccl.usable = true;
    nccl.note = detail::concat("up to ", gpus, " ranks on this machine, one per GPU");
  }
  BackendInfo custom{.name = "custom_ar", .usable = false, .note = {}};
  if (options.disable_custom_ar) {
    custom.note = "disabled by TPCOMM_DISABLE_CUSTOM_AR";
  } else if (gpus == 0) {
    custom.note = "no usable GPU";
  } else if (gpus == 1) {
    custom.usable = true;
    custom.note = "virtual ranks only (one process, several streams)";
  } else {
    auto blocked = std::find_if(r.peers.begin(), r.peers.end(),
                                [](const PeerInfo& p) { return !p.can_access; });
    if (blocked == r.peers.end()) {
      custom.usable = true;
      custom.note = detail::concat(gpus, " GPUs with peer access between every pair");
    } else {
      custom.note = detail::concat("GPU ", blocked->from, " cannot access GPU ", blocked->to,
                                   " (custom kernels need peer access between every pair)");
    }
  }
  r.backends = {nccl, custom};
}

/// The options of the environment, with every variable that cannot be parsed left out (so at its
/// default) and its error appended to `errors`. `Options::from_env` stops at the first bad
/// variable; here each is parsed on its own so that all of them are reported.
Options options_reporting_every_error(std::vector<std::string>* errors) {
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  std::vector<std::string> bad;
  for (const Knob& k : knobs_of(Options{})) {
    try {
      (void)Options::from_lookup([&](const char* name) -> std::optional<std::string> {
        if (k.variable != name) return std::nullopt;
        return env(name);
      });
    } catch (const Error& e) {
      errors->push_back(e.what());
      bad.push_back(k.variable);
    }
  }
  auto good = [&](const char* name) -> std::optional<std::string> {
    if (std::find(bad.begin(), bad.end(), name) != bad.end()) return std::nullopt;
    return env(name);
  };
  try {
    return Options::from_lookup(good);
  } catch (const Error& e) {
    // Only a variable that the table of knobs does not list, or two that conflict, can still
    // fail here.
    errors->push_back(e.what());
    return Options{};
  }
}

Report collect() {
  Report r;
  const Options options = options_reporting_every_error(&r.knobs_errors);
  r.knobs = knobs_of(options);
  for (const int w : {2, 4, 8}) {
    const std::int64_t slot = lamport_slot_bytes(options, w);
    r.lamport.push_back({w, slot, std::int64_t{kLamportBuffers} * w * slot});
  }

  std::string why;
  const Nvml* nvml = Nvml::try_get(&why);
  r.nvml_available = nvml != nullptr;
  r.nvml_reason = why;
  if (nvml != nullptr) r.nvidia_driver = nvml->driver_version();

  why.clear();
  const CudaDriver* drv = CudaDriver::try_get(&why);
  r.driver_available = drv != nullptr;
  r.driver_reason = why;
  if (drv != nullptr) {
    drv->cuDriverGetVersion(&r.driver_version);
    collect_gpus(*drv, nvml, r);
  }

  why.clear();
  r.nccl_path = options.nccl_path;
  if (const NcclLib* nccl = NcclLib::try_load(options.nccl_path, &why)) {
    r.nccl_available = true;
    r.nccl_resolved_path = nccl->resolved_path();
    r.nccl_version = nccl->version_string();
    r.nccl_version_code = nccl->version();
    r.nccl_window_register = nccl->has_window_register;
    r.nccl_mem_alloc = nccl->has_mem_alloc;
    r.nccl_comm_finalize = nccl->has_comm_finalize;
    r.nccl_all_to_all = nccl->has_all_to_all;
    r.nccl_fp8 = nccl->supports_fp8();
  } else {
    r.nccl_reason = why;
  }
  decide_backends(options, r);
  return r;
}

/// A table cell: the value, padded to the column's width.
std::string pad(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string peer_cell(const PeerInfo& p) {
  std::string link = "-";
  if (p.nvlinks.value_or(0) > 0) {
    link = "NV" + std::to_string(*p.nvlinks);
  } else if (p.can_access) {
    link = "P2P";
  }
  return p.can_access ? link + " r" + std::to_string(p.performance_rank) : link;
}

void print_build(const BuildInfo& b, std::ostream& out) {
  out << "tpcomm " << b.version << "\n"
      << "  compiler            " << b.compiler << "\n"
      << "  C++ standard        " << b.cxx_standard << "\n"
      << "  CUDA toolkit        " << cuda_version_string(b.cuda_toolkit) << "\n"
      << "  CUDA architectures  " << b.cuda_architectures << "\n"
      << "  NCCL headers        " << b.nccl_headers << "\n";
}

/// One row per GPU, the name column as wide as the longest name.
void print_gpu_table(const std::vector<GpuInfo>& gpus, std::ostream& out) {
  std::size_t name_width = 4;
  for (const GpuInfo& g : gpus) name_width = std::max(name_width, g.name.size());
  out << "  " << pad("#", 4) << pad("name", name_width + 2) << pad("SMs", 6) << pad("memory", 12)
      << pad("PCI bus id", 15) << "compute\n";
  for (const GpuInfo& g : gpus) {
    out << "  " << pad(std::to_string(g.index), 4) << pad(g.name, name_width + 2)
        << pad(std::to_string(g.sm_count), 6) << pad(gib(g.memory_bytes), 12)
        << pad(g.pci_bus_id, 15) << g.cc_major << "." << g.cc_minor << "\n";
  }
}

/// A GPU-by-GPU matrix of `peer_cell`s, X on the diagonal.
void print_peer_matrix(const Report& r, std::ostream& out) {
  out << "peer access (NV<n>: NVLink, n links; P2P: peer access without NVLink; -: none; "
         "r<k>: the link's performance rank as CUDA reports it)\n";
  std::vector<std::vector<std::string>> cells(r.gpus.size(),
                                              std::vector<std::string>(r.gpus.size(), "X"));
  std::size_t width = 6;
  for (const PeerInfo& p : r.peers) {
    std::string& cell = cells[static_cast<std::size_t>(p.from)][static_cast<std::size_t>(p.to)];
    cell = peer_cell(p);
    width = std::max(width, cell.size() + 2);
  }
  out << "  " << pad("", 6);
  for (const GpuInfo& g : r.gpus) out << pad("GPU" + std::to_string(g.index), width);
  out << "\n";
  for (std::size_t i = 0; i < r.gpus.size(); ++i) {
    out << "  " << pad("GPU" + std::to_string(r.gpus[i].index), 6);
    for (const std::string& cell : cells[i]) out << pad(cell, width);
    out << "\n";
  }
}

/// The driver line, then the GPUs and their peer access when there is a driver.
void print_driver_and_gpus(const Report& r, std::ostream& out) {
  if (!r.driver_available) {
    out << "CUDA driver: " << r.driver_reason << " - GPU sections skipped\n";
    return;
  }
  out << "CUDA driver: " << cuda_version_string(r.driver_version);
  if (!r.nvidia_driver.empty()) out << " (NVIDIA driver " << r.nvidia_driver << ")";
  out << "\n";
  out << "GPUs: " << r.gpus.size() << "\n";
  if (!r.gpus.empty()) print_gpu_table(r.gpus, out);
  if (r.gpus.size() > 1) print_peer_matrix(r, out);
}

void print_nccl(const Report& r, std::ostream& out) {
  if (r.nccl_available) {
    out << "NCCL: " << r.nccl_version << " from " << r.nccl_resolved_path << " (asked for "
        << r.nccl_path << ")\n"
        << "  window registration " << yes_no(r.nccl_window_register) << ", ncclMemAlloc "
        << yes_no(r.nccl_mem_alloc) << ", ncclCommFinalize " << yes_no(r.nccl_comm_finalize)
        << ", ncclAlltoAll " << yes_no(r.nccl_all_to_all) << ", fp8 " << yes_no(r.nccl_fp8) << "\n";
  } else {
    out << "NCCL: " << r.nccl_reason << "\n";
  }
}

void print_backends(const std::vector<BackendInfo>& backends, std::ostream& out) {
  out << "backends\n";
  for (const BackendInfo& be : backends) {
    out << "  " << pad(be.name, 12) << pad(be.usable ? "yes" : "no", 5) << be.note << "\n";
  }
}

void print_algorithms(std::ostream& out) {
  out << "custom all-reduce algorithms (TPCOMM_ALGO, bench --algo)\n";
  for (const AlgoInfo& a : kAlgorithms)
    out << "  " << pad(std::string(a.name), 18) << a.summary << "\n";
  out << "custom exchange algorithms (all-gather, all-to-all, LM head; TPCOMM_EXCHANGE_ALGO, "
         "bench --algo)\n";
  for (const ExchangeInfo& e : kExchangeAlgorithms)
    out << "  " << pad(std::string(e.name), 18) << e.summary << "\n";
}

void print_knobs(const Report& r, std::ostream& out) {
  out << "knobs\n";
  for (const std::string& e : r.knobs_errors) out << "  invalid: " << e << " (default shown)\n";
  std::size_t width = 0;
  for (const Knob& k : r.knobs) width = std::max(width, k.variable.size() + 2);
  for (const Knob& k : r.knobs) out << "  " << pad(k.variable, width) << k.value << "\n";
  out << "Lamport workspace (the fusion workspace), per rank:";
  for (const LamportWorkspace& l : r.lamport) {
    out << (l.world_size == r.lamport.front().world_size ? " " : "; ") << l.world_size
        << " ranks: slot " << format_bytes(l.slot_bytes) << ", " << format_bytes(l.bytes_per_rank)
        << " of peer memory";
  }
  out << "\n";
}

void print_text(const Report& r, std::ostream& out) {
  print_build(r.build, out);
  print_driver_and_gpus(r, out);
  out << "NVML: " << (r.nvml_available ? "available" : r.nvml_reason) << "\n";
  print_nccl(r, out);
  print_backends(r.backends, out);
  print_algorithms(out);
  print_knobs(r, out);
}

json build_json(const BuildInfo& b) {
  return {{"version", b.version},
          {"compiler", b.compiler},
          {"cxx_standard", b.cxx_standard},
          {"cuda_toolkit", cuda_version_string(b.cuda_toolkit)},
          {"cuda_architectures", b.cuda_architectures},
          {"nccl_headers", b.nccl_headers}};
}

json driver_json(const Report& r) {
  json driver = {{"available", r.driver_available}};
  if (r.driver_available) {
    driver["version"] = cuda_version_string(r.driver_version);
    if (!r.nvidia_driver.empty()) driver["nvidia_driver"] = r.nvidia_driver;
  } else {
    driver["reason"] = r.driver_reason;
  }
  return driver;
}

json gpus_json(const std::vector<GpuInfo>& gpus) {
  json out = json::array();
  for (const GpuInfo& g : gpus) {
    out.push_back({{"index", g.index},
                   {"name", g.name},
                   {"sm_count", g.sm_count},
                   {"memory_bytes", g.memory_bytes},
                   {"pci_bus_id", g.pci_bus_id},
                   {"compute_capability", detail::concat(g.cc_major, ".", g.cc_minor)}});
  }
  return out;
}

json peers_json(const std::vector<PeerInfo>& peers) {
  json out = json::array();
  for (const PeerInfo& p : peers) {
    out.push_back({{"from", p.from},
                   {"to", p.to},
                   {"can_access_peer", p.can_access},
                   {"access_supported", p.access_supported != 0},
                   {"performance_rank", p.performance_rank},
                   {"nvlinks", p.nvlinks ? json(*p.nvlinks) : json(nullptr)}});
  }
  return out;
}

json nccl_json(const Report& r) {
  json nccl = {{"available", r.nccl_available}, {"path", r.nccl_path}};
  if (r.nccl_available) {
    nccl["resolved_path"] = r.nccl_resolved_path;
    nccl["version"] = r.nccl_version;
    nccl["version_code"] = r.nccl_version_code;
    nccl["capabilities"] = {{"window_register", r.nccl_window_register},
                            {"mem_alloc", r.nccl_mem_alloc},
                            {"comm_finalize", r.nccl_comm_finalize},
                            {"all_to_all", r.nccl_all_to_all},
                            {"fp8", r.nccl_fp8}};
  } else {
    nccl["reason"] = r.nccl_reason;
  }
  return nccl;
}

json to_json(const Report& r) {
  json j;
  j["tpcomm"] = build_json(r.build);
  j["driver"] = driver_json(r);
  j["gpus"] = gpus_json(r.gpus);
  j["peers"] = peers_json(r.peers);
  j["nvml"] = r.nvml_available ? json{{"available", true}}
                               : json{{"available", false}, {"reason", r.nvml_reason}};
  j["nccl"] = nccl_json(r);
  j["backends"] = json::object();
  for (const BackendInfo& be : r.backends) {
    j["backends"][be.name] = {{"usable", be.usable}, {"note", be.note}};
  }
  j["algorithms"] = json::array();
  for (const AlgoInfo& a : kAlgorithms)
    j["algorithms"].push_back({{"name", a.name}, {"summary", a.summary}});
  j["exchange_algorithms"] = json::array();
  for (const ExchangeInfo& e : kExchangeAlgorithms)
    j["exchange_algorithms"].push_back({{"name", e.name}, {"summary", e.summary}});
  json knobs = json::object();
  for (const Knob& k : r.knobs) knobs[k.variable] = k.value;
  j["knobs"] = knobs;
  json lamport = json::array();
  for (const LamportWorkspace& l : r.lamport) {
    lamport.push_back({{"world_size", l.world_size},
                       {"slot_bytes", l.slot_bytes},
                       {"bytes_per_rank", l.bytes_per_rank}});
  }
  j["lamport_workspace"] = lamport;
  if (!r.knobs_errors.empty()) j["knobs_errors"] = r.knobs_errors;
  return j;
}

}  // namespace

std::string info_report(bool as_json, int* invalid_knobs) {
  const Report report = collect();
  if (invalid_knobs != nullptr) *invalid_knobs = static_cast<int>(report.knobs_errors.size());
  if (as_json) return to_json(report).dump(2) + "\n";
  std::ostringstream out;
  print_text(report, out);
  return out.str();
}

}  // namespace tpcomm
