// SPDX-License-Identifier: Apache-2.0
// The state of one rank's custom all-reduce (`CustomAllReduce::Impl`): its workspace and peers,
// the registry of graph buffers, the failure report. Internal to custom_ar*.cpp.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/custom_ar.hpp"
#include "backends/fingerprint.hpp"
#include "bootstrap/agree.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_driver.hpp"
#include "core/log.hpp"
#include "ipc/layout.hpp"
#include "ipc/peer_buffer.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm {

/// Slots for buffers registered during capture; never reused (graphs may live forever).
constexpr std::int64_t kRegistrySlots = 8192;

/// Launches every kernel a group of `world` ranks may run once on `stream`, each with nothing to
/// do (NOTE [first launch] in custom_ar.cpp).
Status launch_every_kernel(int world, Stream stream) noexcept;

/// The value rank `from` writes into rank `to`'s probe slot when the group is built.
inline std::uint64_t probe_value(int from, int to) {
  return 0x7470636f00000000ull | (static_cast<std::uint64_t>(from) << 8) |
         static_cast<std::uint64_t>(to);
}

struct CustomAllReduce::Impl {
  Bootstrap* boot = nullptr;
  int device = 0;
  int rank = 0;
  int world = 0;
  std::int64_t register_min_bytes = 0;
  bool programmatic = false;
  std::uint64_t timeout_ns = 0;
  std::optional<PeerBuffer> workspace;
  WorkspaceLayout layout{};
  std::array<char*, kMaxRanks> workspaces{};
  std::vector<std::uint64_t> nonces;  // per rank, to tell same-process peers
  bool peers_in_process = false;      // another rank of the group runs in this process
  std::vector<Stream> warm_streams;   // streams `warm_up` has prepared (NOTE [first launch])
  ErrorWord* error_host = nullptr;    // host-mapped
  ErrorWord* error_dev = nullptr;
  RankPtrs* registry = nullptr;        // device, kRegistrySlots entries
  cudaStream_t side_stream = nullptr;  // for the pads after a failure; under failure_mu
  // The kernels' failure as `kernel_failure` describes it, once, for every thread.
  std::mutex failure_mu;
  Status failure = Status::kOk;       // guarded by failure_mu
  std::string failure_message;        // guarded by failure_mu
  std::vector<const void*> recorded;  // this scope's buffers; nullptr = staged
  std::int64_t scope_first_slot = 0;
  std::optional<PeerMappings> registered;     // peers' captured buffers, mapped here
  std::optional<PeerBuffer> exchange_buffer;  // `prepare_exchange`'s staging, if larger
  std::array<char*, kMaxRanks> exchange_staging{};
  std::int64_t exchange_half = 0;

  ~Impl() {
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

  /// Allocates and probes; throws on a local failure.
  void setup_local() {
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
    TPCOMM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&error_host), sizeof(ErrorWord),
                                    cudaHostAllocMapped));
    std::memset(error_host, 0, sizeof(ErrorWord));
    error_host->rank = static_cast<std::uint32_t>(rank);
    error_host->failed = &own_pad->failed;
    TPCOMM_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev), error_host, 0));
    TPCOMM_CUDA_CHECK(cudaMalloc(&registry, kRegistrySlots * sizeof(RankPtrs)));
    TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking));
  }

  /// Learns which ranks share this process and this GPU; returns how many ranks (this one
  /// included) run on this GPU. Collective.
  int meet_peers() {
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

  /// Most blocks of one rank's kernel that keep every rank sharing this GPU resident at once:
  /// ranks sharing one GPU must all be resident, or spinning blocks starve the ones they wait
  /// for, so they split the GPU's block slots (NOTE [programmatic launch] says why one kernel per
  /// rank is enough).
  int resident_blocks(int sharing) const {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    int per_sm = 64;
    for (const AlgoInfo& a : kAlgorithms) {
      for (int f = 0; f < kernels::kFusionCount; ++f) {
        const auto fusion = static_cast<kernels::Fusion>(f);
        const int threads = fusion == kernels::Fusion::kNone ? kernels::max_threads(a.kernel)
                                                             : kernels::kFusedMaxThreads;
        if (kernels::kernel_function(a.kernel, DType::kBF16, world, fusion) != nullptr)
          per_sm = std::min(
              per_sm, kernels::max_blocks_per_sm(a.kernel, DType::kBF16, world, threads, fusion));
      }
    }
    per_sm = std::min(per_sm, kernels::exchange_max_blocks_per_sm(world, 1024));
    return std::max(1, sms * std::max(per_sm, 1) / std::max(sharing, 1));
  }

  /// The same for the fused kernels in clusters of 2, 4 and 8 blocks (NOTE [row groups]): each
  /// rank's share of the clusters the GPU holds at once, in blocks.
  ClusterBlocks resident_cluster_blocks(int sharing) const {
    ClusterBlocks out{};
    for (int i = 0; i < 3; ++i) {
      const int size = 2 << i;
      int clusters = std::numeric_limits<int>::max();
      for (const AlgoInfo& a : kAlgorithms) {
        if (!kernels::fuses(a.kernel)) continue;
        for (int f = 1; f < kernels::kFusionCount; ++f) {
          const auto fusion = static_cast<kernels::Fusion>(f);
          if (!kernels::traits(fusion).rows() ||
              kernels::kernel_function(a.kernel, DType::kBF16, world, fusion) == nullptr)
            continue;
          clusters = std::min(
              clusters, kernels::max_active_clusters(a.kernel, DType::kBF16, world,
                                                     kernels::kFusedMaxThreads, fusion, size));
        }
      }
      if (clusters == std::numeric_limits<int>::max()) clusters = 0;
      out[static_cast<std::size_t>(i)] = clusters / std::max(sharing, 1) * size;
    }
    return out;
  }

  /// What the pads say after a wait gave up (NOTE [bounded waits]).
  struct Progress {
    /// The operation this rank's block `e.block` was in (one past the count it last completed),
    /// and the one `e.peer`'s same block last started: for the barrier kernels the last barrier
    /// value the peer's block published to this rank (`seq * kPhases + phase`, its count modulo
    /// 2^30, completed from this rank's: ranks are never far apart); for the Lamport kernels, its
    /// `lamport_started`.
    std::uint32_t op = 0;
    std::uint32_t peer_op = 0;
    /// The calls this rank's and the peer's kernels last started before they failed, and their
    /// fingerprints (NOTE [fingerprints]).
    std::uint32_t call = 0;
    std::uint64_t fingerprint = 0;
    std::uint32_t peer_call = 0;
    std::uint64_t peer_fingerprint = 0;
  };
  /// Reads `Progress` for error word `e` on `stream`; nullopt when unreadable.
  std::optional<Progress> progress(const ErrorWord& e, cudaStream_t stream) const noexcept;
  /// The status and message of the failure error word `e` reports.
  std::pair<Status, std::string> describe(const ErrorWord& e, cudaStream_t stream) const;

  /// After every rank wrote its probes: checks what arrived here.
  void check_probes() {
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

  /// Collective (NOTE [staging]): exchanges the buffers recorded in this capture scope with
  /// every rank, maps the peers' ones and fills their registry slots. Every rank must have
  /// recorded as many; a failure on any rank fails every rank alike. Throws `Error`.
  void register_recorded() {
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
      TPCOMM_CHECK(all[static_cast<std::size_t>(r)].size() == all[0].size(),
                   Status::kInvalidArgument,
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

  kernels::AllReduceParams params(const TensorView& in, const TensorView& out,
                                  const CallTag& tag) const {
    kernels::AllReduceParams p{};
    p.fingerprint = keyed_fingerprint(tag);
    p.call = tag.call;
    p.input = in.data;
    p.output = out.data;
    for (int r = 0; r < world; ++r) {
      p.workspaces[r] = workspaces[r];
      p.pads[r] = reinterpret_cast<SignalPad*>(workspaces[r] + layout.signal);
    }
    p.layout = layout;
    p.count = in.numel();
    p.dtype = in.dtype;
    p.rank = rank;
    p.world_size = world;
    p.timeout_ns = timeout_ns;
    p.error = error_dev;
    return p;
  }
};

}  // namespace tpcomm
