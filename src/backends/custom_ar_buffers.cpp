// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce's buffers: building a rank's share of the group (its workspace, probed,
// and its peers), the exchange's larger staging, and the registry of buffers captured in CUDA
// graphs (the launches are in custom_ar.cpp, the failure report in custom_ar_failure.cpp, the
// tuner in custom_ar_tune.cpp).
#include "backends/custom_ar.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/custom_ar_impl.hpp"
#include "bootstrap/agree.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"

namespace tpcomm {
namespace {

/// The value rank `from` writes into rank `to`'s probe slot when the group is built.
std::uint64_t probe_value(int from, int to) {
  return 0x7470636f00000000ull | (static_cast<std::uint64_t>(from) << 8) |
         static_cast<std::uint64_t>(to);
}

}  // namespace

CustomAllReduce::Impl::~Impl() {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  registered.reset();
  exchange_buffer.reset();
  workspace.reset();  // collective: barrier before free
  if (registry != nullptr) cudaFree(registry);
  if (side_stream != nullptr) cudaStreamDestroy(side_stream);
  if (error_host != nullptr) cudaFreeHost(error_host);
  cudaSetDevice(previous);
}

void CustomAllReduce::Impl::setup_local() {
  DeviceGuard guard(device);
  // The first launch of every kernel in this process, while no peer can be waiting (NOTE
  // [first launch]); each stream the group later uses gets its own in `warm_up`.
  TPCOMM_CHECK(launch_every_kernel(world, nullptr) == Status::kOk, Status::kCudaError,
               "loading the all-reduce kernels failed");
  // Mappings written by peers, read back locally: a real check of every path.
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    const std::uint64_t v = probe_value(rank, r);
    auto* pad = reinterpret_cast<SignalPad*>(workspaces[r] + layout.signal);
    TPCOMM_CUDA_CHECK(cudaMemcpy(&pad->probe[rank], &v, sizeof(v), cudaMemcpyHostToDevice));
  }
  // Every Lamport buffer starts empty (NOTE [lamport]), before any peer can push into it.
  const std::int64_t lamport_bytes = layout.total - layout.lamport;
  TPCOMM_CHECK(kernels::fill_lamport_empty(workspaces[rank] + layout.lamport, lamport_bytes,
                                           nullptr) == Status::kOk,
               Status::kCudaError, "emptying the Lamport buffers failed");
  auto* own_pad = reinterpret_cast<SignalPad*>(workspaces[rank] + layout.signal);
  TPCOMM_CHECK(
      kernels::fill_lamport_empty(own_pad->lamport_fingerprint,
                                  sizeof(own_pad->lamport_fingerprint), nullptr) == Status::kOk,
      Status::kCudaError, "emptying the Lamport headers failed");
  TPCOMM_CUDA_CHECK(cudaDeviceSynchronize());
  TPCOMM_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&error_host), sizeof(ErrorWord), cudaHostAllocMapped));
  std::memset(error_host, 0, sizeof(ErrorWord));
  error_host->rank = static_cast<std::uint32_t>(rank);
  error_host->failed = &own_pad->failed;
  TPCOMM_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev), error_host, 0));
  TPCOMM_CUDA_CHECK(cudaMalloc(&registry, kRegistrySlots * sizeof(RankPtrs)));
  TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
}

int CustomAllReduce::Impl::meet_peers() {
  struct Where {
    std::uint64_t nonce;
    std::int32_t device;
    std::int32_t node;
  } mine{process_nonce(), device, boot->node_id()};
  int sharing = 0;
  for (const Where& w : boot->all_gather_value(mine)) {
    sharing += w.node == mine.node && w.device == mine.device ? 1 : 0;
    nonces.push_back(w.nonce);
  }
  for (int r = 0; r < world; ++r)
    peers_in_process = peers_in_process || (r != rank && nonces[r] == mine.nonce);
  return sharing;
}

void CustomAllReduce::Impl::check_probes() {
  DeviceGuard guard(device);
  std::array<std::uint64_t, kMaxRanks> got{};
  auto* pad = reinterpret_cast<SignalPad*>(workspaces[rank] + layout.signal);
  TPCOMM_CUDA_CHECK(cudaMemcpy(got.data(), pad->probe, sizeof(got), cudaMemcpyDeviceToHost));
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    TPCOMM_CHECK(got[r] == probe_value(r, rank), Status::kUnavailable,
                 "peer memory probe: what rank ", r, " wrote did not arrive at rank ", rank);
  }
}

std::unique_ptr<CustomAllReduce> CustomAllReduce::create(Bootstrap& boot, int device,
                                                         const Options& options,
                                                         std::string* why_not) {
  const int world = boot.world_size();
  auto fail = [&](std::string why) -> std::unique_ptr<CustomAllReduce> {
    if (why_not != nullptr) *why_not = std::move(why);
    return nullptr;
  };
  // Rank-invariant refusals first: every rank sees the same options and world size.
  if (options.disable_custom_ar) return fail("disabled by TPCOMM_DISABLE_CUSTOM_AR");
  if (options.algo == "nccl") return fail("TPCOMM_ALGO=nccl");
  if (world < 2 || world > kMaxRanks)
    return fail("world size " + std::to_string(world) + " is outside 2.." +
                std::to_string(kMaxRanks));

  auto impl = std::make_unique<Impl>();
  impl->boot = &boot;
  impl->device = device;
  impl->rank = boot.rank();
  impl->world = world;
  impl->register_min_bytes = options.custom_ar_register_min_bytes;
  impl->programmatic = options.programmatic_launch;
  // Clamped as Options documents, so that the product cannot overflow (far from it).
  static_assert(Options::kMaxTimeoutMs <= std::numeric_limits<std::int64_t>::max() / 1000000);
  impl->timeout_ns = static_cast<std::uint64_t>(
                         std::clamp<std::int64_t>(options.timeout_ms, 1, Options::kMaxTimeoutMs)) *
                     1000000ull;
  const std::int64_t lamport_max_bytes = lamport_slot_bytes(options, world);
  impl->layout = WorkspaceLayout::make(options.custom_ar_max_bytes, lamport_max_bytes, world);

  // All-or-nothing on every rank (it votes internally).
  try {
    impl->workspace.emplace(boot, device, static_cast<std::size_t>(impl->layout.total));
  } catch (const Error& e) {
    return fail(e.what());
  }
  for (int r = 0; r < world; ++r)
    impl->workspaces[r] = static_cast<char*>(impl->workspace->peer(r));

  // Local setup and probe; then every rank votes.
  std::string local_error;
  try {
    impl->setup_local();
  } catch (const Error& e) {
    local_error = e.what();
  }
  boot.barrier();  // every probe written before anyone reads
  if (local_error.empty()) {
    try {
      impl->check_probes();
    } catch (const Error& e) {
      local_error = e.what();
    }
  }
  if (std::string why = agree(boot, local_error); !why.empty()) return fail(why);
  const int sharing = impl->meet_peers();
  SelectorCaps caps{};
  caps.world_size = world;
  caps.custom_available = true;
  caps.max_bytes = options.custom_ar_max_bytes;
  caps.lamport_max_bytes = lamport_max_bytes;
  caps.deterministic = options.deterministic != Determinism::kOff;
  caps.exchange_max_bytes = impl->layout.half_bytes;
  impl->exchange_half = impl->layout.half_bytes;
  for (int r = 0; r < world; ++r)
    impl->exchange_staging[r] = impl->workspaces[r] + impl->layout.staging;
  caps.max_blocks = std::min(kMaxBlocks, impl->resident_blocks(sharing));
  caps.max_cluster_blocks = impl->resident_cluster_blocks(sharing);
  // The smallest of the ranks' limits, so every rank launches the same grid.
  std::array<std::int32_t, 4> mine{caps.max_blocks, caps.max_cluster_blocks[0],
                                   caps.max_cluster_blocks[1], caps.max_cluster_blocks[2]};
  for (const auto& v : boot.all_gather_value(mine)) {
    caps.max_blocks = std::min(caps.max_blocks, static_cast<int>(v[0]));
    for (std::size_t i = 0; i < 3; ++i)
      caps.max_cluster_blocks[i] = std::min(caps.max_cluster_blocks[i], static_cast<int>(v[i + 1]));
  }
  TPCOMM_LOG_INFO("custom all-reduce ready: rank ", impl->rank, "/", world, ", ",
                  impl->layout.total, " workspace bytes (Lamport up to ", caps.lamport_max_bytes,
                  " bytes), up to ", caps.max_blocks, " blocks per kernel (",
                  caps.max_cluster_blocks[0], ", ", caps.max_cluster_blocks[1], ", ",
                  caps.max_cluster_blocks[2], " in clusters of 2, 4, 8)",
                  sharing > 1 ? " (ranks share a GPU)" : "");
  return std::unique_ptr<CustomAllReduce>(new CustomAllReduce(std::move(impl), caps));
}

CustomAllReduce::CustomAllReduce(std::unique_ptr<Impl> impl, SelectorCaps caps)
    : impl_(std::move(impl)), caps_(caps) {}

CustomAllReduce::~CustomAllReduce() = default;

void CustomAllReduce::prepare_exchange(std::int64_t bytes) {
  Impl& m = *impl_;
  if (bytes <= m.exchange_half) return;
  DeviceGuard guard(m.device);
  const WorkspaceLayout layout = WorkspaceLayout::make(bytes);
  PeerBuffer buffer(*m.boot, m.device, static_cast<std::size_t>(2 * layout.half_bytes));
  m.exchange_buffer.reset();  // collective: every rank frees the old one alike
  m.exchange_buffer.emplace(std::move(buffer));
  for (int r = 0; r < m.world; ++r)
    m.exchange_staging[r] = static_cast<char*>(m.exchange_buffer->peer(r));
  m.exchange_half = layout.half_bytes;
  caps_.exchange_max_bytes = layout.half_bytes;
  TPCOMM_LOG_INFO("exchange staging: rank ", m.rank, " holds inputs of up to ", m.exchange_half,
                  " bytes");
}

void CustomAllReduce::Impl::register_recorded() {
  std::string local_error;
  std::vector<BufferRecord> mine(recorded.size());
  try {
    for (std::size_t i = 0; i < recorded.size(); ++i)
      if (recorded[i] != nullptr)
        mine[i] = PeerMappings::describe(recorded[i], device, boot->node_id());
  } catch (const Error& err) {
    local_error = err.what();
  }
  if (std::string why = agree(*boot, local_error); !why.empty())
    TPCOMM_THROW(Status::kCudaError, "registering captured buffers failed on ", why);
  const auto all = boot->all_gather(std::as_bytes(std::span(mine)));
  for (int r = 1; r < world; ++r)
    TPCOMM_CHECK(all[static_cast<std::size_t>(r)].size() == all[0].size(), Status::kInvalidArgument,
                 "ranks captured different numbers of custom all-reduce calls (rank 0: ",
                 all[0].size() / sizeof(BufferRecord), ", rank ", r, ": ",
                 all[static_cast<std::size_t>(r)].size() / sizeof(BufferRecord),
                 "); every rank must capture the same calls");
  std::vector<RankPtrs> slots(recorded.size());
  std::string map_error;
  try {
    if (!registered) registered.emplace(device);
    for (int r = 0; r < world; ++r) {
      for (std::size_t i = 0; i < slots.size(); ++i) {
        BufferRecord theirs;
        std::memcpy(&theirs, all[static_cast<std::size_t>(r)].data() + i * sizeof(theirs),
                    sizeof(theirs));
        slots[i].ptr[r] = theirs.ptr == 0 ? nullptr
                          : r == rank     ? recorded[i]
                                          : registered->map(theirs, boot->node_id());
      }
    }
    if (!slots.empty())
      TPCOMM_CUDA_CHECK(cudaMemcpy(registry + scope_first_slot, slots.data(),
                                   slots.size() * sizeof(RankPtrs), cudaMemcpyHostToDevice));
  } catch (const Error& err) {
    map_error = err.what();
  }
  // A rank that could not map must not leave the others replaying into garbage.
  if (std::string why = agree(*boot, map_error); !why.empty())
    TPCOMM_THROW(Status::kCudaError, "mapping captured buffers failed on ", why);
}

void CustomAllReduce::begin_capture() noexcept {
  capture_open_ = true;
  impl_->recorded.clear();
  impl_->scope_first_slot = next_slot_;
}

Status CustomAllReduce::end_capture() noexcept {
  Impl& m = *impl_;
  capture_open_ = false;
  try {
    DeviceGuard guard(m.device);
    m.register_recorded();
  } catch (const Error& err) {
    health_ = err.status();
    error_message_ = err.what();
    TPCOMM_LOG_ERROR(error_message_);
    return health_;
  }
  TPCOMM_LOG_DEBUG("registered ", m.recorded.size(), " captured buffers (slots ",
                   m.scope_first_slot, "..", next_slot_, ")");
  m.recorded.clear();
  return Status::kOk;
}

}  // namespace tpcomm
