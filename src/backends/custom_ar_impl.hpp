// SPDX-License-Identifier: Apache-2.0
// The state of one rank's custom all-reduce (`CustomAllReduce::Impl`): its workspace and peers,
// the registry of graph buffers, the failure report. Internal to custom_ar*.cpp: the workspace,
// the peers and the registration are in custom_ar_buffers.cpp, the launches in custom_ar.cpp, the
// failure report in custom_ar_failure.cpp, the tuner in custom_ar_tune.cpp.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backends/custom_ar.hpp"
#include "backends/fingerprint.hpp"
#include "ipc/layout.hpp"
#include "ipc/peer_buffer.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm {

/// Slots for buffers registered during capture; never reused (graphs may live forever).
constexpr std::int64_t kRegistrySlots = 8192;

/// Launches every kernel a group of `world` ranks may run once on `stream`, each with nothing to
/// do (NOTE [first launch] in custom_ar.cpp).
Status launch_every_kernel(int world, Stream stream) noexcept;

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

  ~Impl();

  /// Allocates and probes; throws on a local failure.
  void setup_local();

  /// Learns which ranks share this process and this GPU; returns how many ranks (this one
  /// included) run on this GPU. Collective.
  int meet_peers();

  /// Most blocks of one rank's kernel that keep every rank sharing this GPU resident at once:
  /// ranks sharing one GPU must all be resident, or spinning blocks starve the ones they wait
  /// for, so they split the GPU's block slots (NOTE [programmatic launch] says why one kernel per
  /// rank is enough).
  int resident_blocks(int sharing) const;

  /// The same for the fused kernels in clusters of 2, 4 and 8 blocks (NOTE [row groups]): each
  /// rank's share of the clusters the GPU holds at once, in blocks.
  ClusterBlocks resident_cluster_blocks(int sharing) const;

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
  void check_probes();

  /// Collective (NOTE [staging]): exchanges the buffers recorded in this capture scope with
  /// every rank, maps the peers' ones and fills their registry slots. Every rank must have
  /// recorded as many; a failure on any rank fails every rank alike. Throws `Error`.
  void register_recorded();

  /// The all-reduce kernels' arguments for a call from `in` into `out` tagged `tag`: this rank's
  /// workspace, peers and deadline; no registered inputs, no epilogue.
  kernels::AllReduceParams params(const TensorView& in, const TensorView& out,
                                  const CallTag& tag) const;
};

}  // namespace tpcomm
