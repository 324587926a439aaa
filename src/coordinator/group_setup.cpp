// SPDX-License-Identifier: Apache-2.0
// Building a group: the ranks meet, agree on their settings, and build the backend chain (the
// custom kernels, NCCL, the composite paths), the tuned table, the rank watch and the watchdog.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <span>
#include <string>

#include "backends/custom_ar_backend.hpp"
#include "backends/local.hpp"
#include "backends/nccl_backend.hpp"
#include "backends/nccl_lib.hpp"
#include "bootstrap/agree.hpp"
#include "coordinator/group_impl.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "ipc/peer_buffer.hpp"
#include "kernels/kernels.hpp"
#include "ops/exchange.hpp"
#include "ops/fused_norm.hpp"
#include "ops/moe.hpp"
#include "ops/reduce.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {

/// What every rank tells the others at construction.
struct RankInfo {
  std::uint64_t nonce;
  std::int32_t node;
  std::int32_t device;
  std::array<char, 32> bus_id;
  std::int32_t nccl_loadable;
  std::int32_t nccl_version;
};

/// What the ranks told each other at construction.
struct Peers {
  std::vector<RankInfo> infos;
  /// Every rank runs on this rank's GPU.
  bool one_gpu = true;
  /// The first two ranks that share a GPU, or {-1, -1}.
  std::pair<int, int> shared{-1, -1};
};

namespace {

bool same_gpu(const RankInfo& a, const RankInfo& b) {
  return a.node == b.node && std::strcmp(a.bus_id.data(), b.bus_id.data()) == 0;
}

/// Throws kUnsupported, saying how to build for it, when this library carries no kernels that
/// `device`'s GPU runs (built for other CUDA architectures: TPCOMM_CUDA_ARCHITECTURES).
void require_kernel_image(int device) {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(
      &attr, kernels::kernel_function(info(Algo::kOneShot).kernel, DType::kF32, 2));
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  int major = 0;
  int minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const bool no_image = e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction;
  TPCOMM_THROW(no_image ? Status::kUnsupported : Status::kCudaError, "GPU ", device,
               " (compute capability ", major, ".", minor, ") runs none of this libtpcomm's ",
               "kernels, built for CUDA architectures ", TPCOMM_CUDA_ARCHITECTURES,
               ": build with -DCMAKE_CUDA_ARCHITECTURES=", major, minor, major >= 9 ? "a" : "",
               " (", cudaGetErrorString(e), ")");
}

/// A namespace of the group's own in `boot`'s store, named by rank 0. Collective.
Bootstrap own_namespace(Bootstrap& boot) {
  std::uint64_t tag = std::random_device{}();
  tag = (tag << 32) ^ std::random_device{}() ^ process_nonce();
  tag = boot.broadcast_value(tag, 0);
  std::vector<int> ranks(static_cast<std::size_t>(boot.world_size()));
  for (int r = 0; r < boot.world_size(); ++r) ranks[static_cast<std::size_t>(r)] = r;
  return boot.split(ranks, "group-" + std::to_string(tag));
}

}  // namespace

/// Subscribes to the store's news of lost ranks: a lost member (or the store's host) makes
/// the kernels give up at once and the next call fail (`poll_health`).
void Group::Impl::watch_members() {
  if (!options.rank_watch) return;
  rank_watch = boot.shared_store()->rank_watch();
  if (!rank_watch) return;
  std::vector<int> members(static_cast<std::size_t>(boot.world_size()));
  for (int r = 0; r < boot.world_size(); ++r)
    members[static_cast<std::size_t>(r)] = boot.job_rank(r);
  watch_id = rank_watch->subscribe([this, members](int lost, const std::string& reason) {
    const auto it = std::find(members.begin(), members.end(), lost);
    if (lost >= 0 && it == members.end()) return;
    const auto group_rank = it - members.begin();
    request_abort(lost < 0 || group_rank == lost
                      ? reason
                      : detail::concat(reason, " (rank ", group_rank, " of this group)"));
  });
}

void Group::Impl::start_watchdog() {
  if (!watched && !rank_watch) return;
  watchdog.emplace(
      detail::concat("group of ", boot.world_size(), " ranks, rank ", boot.rank(), " (device ",
                     device, ")"),
      options.failure_mode, [this] { return watched_failure(); },
      [this](const Watchdog::Failure& f) { request_abort(f.second, f.first); });
}

/// Every rank's `RankInfo`, and what they say about the group's GPUs.
Peers Group::Impl::meet_peers(bool want_nccl, std::string* nccl_why) {
  RankInfo info{};
  info.nonce = process_nonce();
  info.node = boot.node_id();
  info.device = device;
  TPCOMM_CUDA_CHECK(
      cudaDeviceGetPCIBusId(info.bus_id.data(), static_cast<int>(info.bus_id.size()), device));
  if (want_nccl) {
    try {
      info.nccl_version = NcclLib::load(options.nccl_path).version();
      info.nccl_loadable = 1;
    } catch (const Error& e) {
      *nccl_why = e.what();
    }
  }
  Peers peers;
  peers.infos = boot.all_gather_value(info);
  const int world = boot.world_size();
  for (int r = 0; r < world; ++r) {
    const RankInfo& o = peers.infos[static_cast<std::size_t>(r)];
    if (!same_gpu(o, info)) peers.one_gpu = false;
    for (int q = 0; q < r && peers.shared.first < 0; ++q)
      if (same_gpu(peers.infos[static_cast<std::size_t>(q)], o)) peers.shared = {q, r};
  }
  return peers;
}

/// The custom all-reduce, where every rank can take part (it votes); a log line otherwise.
void Group::Impl::add_custom(Pinned pinned, const GroupConfig& config) {
  std::string why;
  Options custom_options = options;
  if (!config.fusion) custom_options.lamport_max_bytes = 0;  // no fusion workspace
  if (config.fusion_max_tokens >= 0) custom_options.fusion_max_tokens = config.fusion_max_tokens;
  if (config.fusion_hidden > 0) custom_options.fusion_hidden = config.fusion_hidden;
  if (auto ar = CustomAllReduce::create(boot, device, custom_options, &why)) {
    PinnedExchange pinned_exchange;
    (void)parse_pinned_exchange(options.exchange_algo, &pinned_exchange);  // checked by Group
    auto backend = std::make_unique<CustomArBackend>(std::move(ar), pinned, pinned_exchange, &table,
                                                     options.lm_head_a2a != Switch::kOff,
                                                     options.moe_prologue == Switch::kOn);
    custom = backend.get();
    watched = true;
    chain.add(std::move(backend));
  } else if (boot.rank() == 0) {
    TPCOMM_LOG_WARN("custom all-reduce not used: ", why);
  }
}

/// NCCL, unless a rank cannot load it or two ranks share a GPU (which NCCL refuses).
void Group::Impl::add_nccl(const Peers& peers, const std::string& nccl_why) {
  int missing = -1;
  for (int r = 0; r < boot.world_size() && missing < 0; ++r)
    if (peers.infos[static_cast<std::size_t>(r)].nccl_loadable == 0) missing = r;
  if (missing >= 0) {
    if (boot.rank() == 0 || missing == boot.rank())
      TPCOMM_LOG_WARN("NCCL not used: rank ", missing, " cannot load it",
                      nccl_why.empty() ? std::string() : ": " + nccl_why);
  } else if (peers.shared.first >= 0) {
    if (boot.rank() == 0)
      TPCOMM_LOG_WARN("NCCL not used: ranks ", peers.shared.first, " and ", peers.shared.second,
                      " share one GPU, which NCCL refuses");
  } else {
    chain.add(std::make_unique<NcclBackend>(std::make_unique<NcclComm>(boot, device, options)));
    watched = true;
  }
}

/// The tuned table for this group's key: rank 0 reads the cache, every rank installs what it
/// read, so all decide alike.
void Group::Impl::load_tune_table(const Peers& peers) {
  cudaDeviceProp prop{};
  TPCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0;
  cudaDriverGetVersion(&driver);
  tune_key = TuneKey{};
  tune_key.gpu = prop.name;
  tune_key.world_size = boot.world_size();
  tune_key.topology = peers.one_gpu ? "one-gpu" : "p2p";
  tune_key.driver_version = driver;
  tune_key.nccl_version = peers.infos[0].nccl_version;
  tune_key.tpcomm_version = TPCOMM_VERSION;
  std::string text;
  const std::string path = tune_path(options, tune_key);
  if (boot.rank() == 0) {
    std::string why;
    if (auto t = TuneTable::load(path, tune_key, &why)) {
      text = t->to_text();
      TPCOMM_LOG_INFO("using tuned table ", path);
    } else {
      TPCOMM_LOG_INFO("no tuned table (", why, "); built-in thresholds decide");
    }
  }
  auto shared = boot.broadcast(std::as_bytes(std::span(text.data(), text.size())), 0);
  if (!shared.empty()) {
    table_storage = TuneTable::parse(
        std::string_view(reinterpret_cast<const char*>(shared.data()), shared.size()));
    table = &*table_storage;
  }
}

void Group::Impl::add_composites() {
  chain.add(make_unfused_norm_backend(chain, shape(), options.deterministic != Determinism::kOff));
  // The LM head's fallback keeps its temporary where the custom exchange will not serve it.
  chain.add(make_gather_copy_backend(chain, shape(),
                                     custom == nullptr || options.lm_head_a2a == Switch::kOff));
  chain.add(make_reduce_slice_backend(chain, shape()));
  chain.add(make_moe_combine_backend(chain));
}

namespace {

/// Collective: throws kInvalidArgument on every rank, naming each setting and the ranks with each
/// value, unless every rank holds the same settings that decide which path a call takes or how
/// the ranks' shared buffers are laid out. Ranks that differ there would wait for each other
/// until their deadline, or read each other's buffers at the wrong places.
void require_same_settings(Bootstrap& boot, const Options& o, const GroupConfig& c) {
  auto flag = [](bool b) { return std::string(b ? "1" : "0"); };
  const Setting settings[] = {
      {"TPCOMM_ALGO", o.algo},
      {"TPCOMM_EXCHANGE_ALGO", o.exchange_algo},
      {"TPCOMM_CUSTOM_AR_MAX_BYTES", std::to_string(o.custom_ar_max_bytes)},
      {"TPCOMM_CUSTOM_AR_REGISTER_BYTES", std::to_string(o.custom_ar_register_min_bytes)},
      {"TPCOMM_LAMPORT_MAX_BYTES", std::to_string(o.lamport_max_bytes)},
      {"TPCOMM_FUSION_MAX_TOKENS (or GroupConfig::fusion_max_tokens)",
       std::to_string(c.fusion_max_tokens >= 0 ? c.fusion_max_tokens : o.fusion_max_tokens)},
      {"TPCOMM_FUSION_HIDDEN (or GroupConfig::fusion_hidden)",
       std::to_string(c.fusion_hidden > 0 ? c.fusion_hidden : o.fusion_hidden)},
      {"TPCOMM_DISABLE_CUSTOM_AR", flag(o.disable_custom_ar)},
      {"TPCOMM_DISABLE_NCCL", flag(o.disable_nccl)},
      {"TPCOMM_LM_HEAD_A2A", std::string(to_string(o.lm_head_a2a))},
      {"TPCOMM_MOE_PROLOGUE", std::string(to_string(o.moe_prologue))},
      {"TPCOMM_NCCL_CHECK", std::string(to_string(o.nccl_check))},
      {"TPCOMM_DETERMINISTIC (or GroupConfig::deterministic)",
       std::string(to_string(o.deterministic))},
      {"GroupConfig::custom_all_reduce", flag(c.custom_all_reduce)},
      {"GroupConfig::nccl", flag(c.nccl)},
      {"GroupConfig::fusion", flag(c.fusion)},
  };
  const std::string why = disagreements(boot, settings);
  TPCOMM_CHECK(why.empty(), Status::kInvalidArgument,
               "the ranks' settings differ where they must match (set them alike on every rank):\n",
               why);
}

}  // namespace

Group::Group(Bootstrap& boot, int device, Options options, GroupConfig config) {
  Pinned pinned;
  TPCOMM_CHECK(parse_pinned(options.algo, &pinned), Status::kInvalidArgument, "algorithm \"",
               options.algo, "\" (TPCOMM_ALGO) is not one of ", pinned_names());
  options.algo = std::string(to_string(pinned));
  PinnedExchange pinned_exchange;
  TPCOMM_CHECK(parse_pinned_exchange(options.exchange_algo, &pinned_exchange),
               Status::kInvalidArgument, "exchange algorithm \"", options.exchange_algo,
               "\" (TPCOMM_EXCHANGE_ALGO) is not one of auto, ", exchange_names());
  TPCOMM_CHECK(config.fusion_max_tokens >= -1 && config.fusion_max_tokens <= 65536 &&
                   config.fusion_hidden >= 0 && config.fusion_hidden <= 65536,
               Status::kInvalidArgument, "GroupConfig: fusion_max_tokens ",
               config.fusion_max_tokens, " (wanted -1 to 65536) or fusion_hidden ",
               config.fusion_hidden, " (wanted 0 to 65536) out of range");
  // The rows size the Lamport slots: the cap of TPCOMM_FUSION_MAX_TOKENS x TPCOMM_FUSION_HIDDEN.
  TPCOMM_CHECK(config.fusion_max_tokens <= 0 || config.fusion_hidden <= 0 ||
                   config.fusion_max_tokens * config.fusion_hidden * 2 <= Options::kMaxLamportBytes,
               Status::kInvalidArgument, "GroupConfig: fusion_max_tokens ",
               config.fusion_max_tokens, " x fusion_hidden ", config.fusion_hidden,
               " rows of 2 bytes are more than ", Options::kMaxLamportBytes,
               " bytes, the cap of TPCOMM_LAMPORT_MAX_BYTES");
  impl_ = std::make_unique<Impl>(own_namespace(boot));
  Impl& m = *impl_;
  m.device = device;
  m.options = std::move(options);
  if (config.deterministic) m.options.deterministic = *config.deterministic;
  require_same_settings(m.boot, m.options, config);
  DeviceGuard guard(device);
  require_kernel_image(device);
  // TPCOMM_ALGO=nccl means NCCL for everything, even at world size 1 (to measure it).
  const bool nccl_only = pinned == Algo::kNone;
  const int world = m.boot.world_size();
  const bool want_nccl = config.nccl && !m.options.disable_nccl && (world > 1 || nccl_only);
  std::string nccl_why;
  const Peers peers = m.meet_peers(want_nccl, &nccl_why);
  if (world == 1 && !nccl_only) m.chain.add(make_local_backend());
  if (config.custom_all_reduce && world > 1) m.add_custom(pinned, config);
  if (want_nccl) m.add_nccl(peers, nccl_why);
  m.add_composites();
  if (m.custom != nullptr) m.load_tune_table(peers);
  m.watch_members();
  m.start_watchdog();
}

}  // namespace tpcomm
