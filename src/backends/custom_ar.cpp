// SPDX-License-Identifier: Apache-2.0
#include "backends/custom_ar.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "backends/exchange_plan.hpp"
#include "backends/fingerprint.hpp"
#include "bootstrap/agree.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_driver.hpp"
#include "core/log.hpp"
#include "core/overlap.hpp"
#include "ipc/layout.hpp"
#include "ipc/peer_buffer.hpp"
#include "kernels/kernels.hpp"
#include "tune/graph_timer.hpp"
#include "tune/tuner.hpp"

namespace tpcomm {

// NOTE [first launch]
// Ranks that share a process (virtual ranks, or one thread per GPU) wait for each other inside
// kernels, and the first launch of a kernel can hold up its rank until the device has no other
// work, which a peer spinning for that rank never allows: the ranks wedge until the deadline.
// Measured on an H200 with 8 virtual ranks (docs/FIRST-LAUNCH.md):
//  - with lazy module loading (CUDA's default), the launch call of a cold kernel loads its module
//    under the context lock and waits for the device to go idle; every rank's thread blocks in
//    its next CUDA call;
//  - with CUDA_MODULE_LOADING=EAGER no call blocks, yet one rank's next kernel does not start
//    until its peers have given up. Loading the function beforehand (cudaFuncGetAttributes, an
//    occupancy query) or launching it on another stream does not prevent this; launching it once
//    on the same stream before the first collective does.
// So a group launches every kernel it may run once when it is built (nothing can be waiting
// then), and once more on each stream before its first collective there (`warm_up`, which ends
// with a barrier so that no rank starts a collective before every rank is done). Callers do the
// same for their own kernels (README, "Ranks that share a process").

namespace {

/// Slots for buffers registered during capture; never reused (graphs may live forever).
constexpr std::int64_t kRegistrySlots = 8192;

/// Launches every kernel a group of `world` ranks may run once on `stream`, each with nothing to
/// do (NOTE [first launch]): every algorithm of the registry for every dtype and epilogue it
/// serves, the local add + RMSNorm, the Lamport refill, the exchange kernels, and the test-data
/// kernels of `tpcomm bench` and the tests.
Status launch_every_kernel(int world, Stream stream) noexcept {
  kernels::AllReduceParams empty{};  // count 0: the kernels return at once
  empty.world_size = world;
  for (const AlgoInfo& a : kAlgorithms) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int f = 0; f < kernels::kFusionCount; ++f) {
        empty.fusion.kind = static_cast<kernels::Fusion>(f);
        empty.fusion.hidden = kernels::kFp8Group;  // a row length every epilogue takes
        if (kernels::kernel_function(a.kernel, t, world, empty.fusion.kind) == nullptr) continue;
        empty.dtype = t;
        TPCOMM_TRY(kernels::launch_all_reduce(empty, a.kernel, {1, 32}, false, stream));
      }
    }
  }
  // The local add + RMSNorm of the fused operation's fallback.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int f = 1; f < kernels::kFusionCount; ++f) {
      kernels::FusionParams none{};
      none.kind = static_cast<kernels::Fusion>(f);
      TPCOMM_TRY(kernels::launch_add_rmsnorm(nullptr, nullptr, none, 0, t, stream));
    }
  }
  TPCOMM_TRY(kernels::fill_lamport_empty(nullptr, 0, stream));
  TPCOMM_TRY(kernels::warm_up_exchange(world, stream));
  return kernels::warm_up_test_data(stream);
}

std::uint64_t probe_value(int from, int to) {
  return 0x7470636f00000000ull | (static_cast<std::uint64_t>(from) << 8) |
         static_cast<std::uint64_t>(to);
}

}  // namespace

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
        const int threads = fusion == kernels::Fusion::kNone ? 1024 : kernels::kFusedMaxThreads;
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
          if (!kernels::traits(fusion).norm ||
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
  std::optional<Progress> progress(const ErrorWord& e, cudaStream_t stream) const noexcept {
    if (e.peer >= static_cast<std::uint32_t>(world) || e.block >= kMaxBlocks) return {};
    const bool lamport = e.counter == ErrorWord::kLamportCount;
    auto pad = [&](std::uint32_t r) {
      return reinterpret_cast<const SignalPad*>(workspaces[r] + layout.signal);
    };
    const SignalPad* own = pad(static_cast<std::uint32_t>(rank));
    const SignalPad* theirs = pad(e.peer);
    Progress p;
    std::uint32_t counts[2] = {};
    struct Read {
      void* to;
      const void* from;
      std::size_t bytes;
    };
    const Read reads[] = {
        {&counts[0], lamport ? &own->lamport_seq[e.block] : &own->seq[e.block], 4},
        // A flag's barrier value is its low half (NOTE [signal pad]; little-endian).
        {&counts[1],
         lamport ? static_cast<const void*>(&theirs->lamport_started[e.block])
                 : static_cast<const void*>(&own->flags[e.block][e.peer]),
         4},
        {&p.call, &own->posted_call, 4},
        {&p.fingerprint, &own->posted_fingerprint, 8},
        {&p.peer_call, &theirs->posted_call, 4},
        {&p.peer_fingerprint, &theirs->posted_fingerprint, 8},
    };
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return {};
    bool read = true;
    for (const Read& r : reads)
      read = read &&
             cudaMemcpyAsync(r.to, r.from, r.bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess;
    read = read && cudaStreamSynchronize(stream) == cudaSuccess;
    cudaSetDevice(previous);
    if (!read) return {};
    p.op = counts[0] + 1u;
    p.peer_op = counts[1];
    if (!lamport) {
      const std::uint32_t low = counts[1] / SignalPad::kPhases;
      p.peer_op =
          p.op + static_cast<std::uint32_t>(static_cast<std::int32_t>((low - p.op) << 2) >> 2);
    }
    return p;
  }

  /// The status and message of the failure error word `e` reports.
  std::pair<Status, std::string> describe(const ErrorWord& e, cudaStream_t stream) const {
    const std::optional<Progress> p = progress(e, stream);
    const std::uint32_t call = p ? p->call : 0;
    const std::uint64_t fingerprint = p ? p->fingerprint : 0;
    const std::string mine = describe_fingerprint(fingerprint);
    auto mismatch = [&](std::uint64_t theirs) {
      return std::pair{
          Status::kMismatch,
          detail::concat("ranks called different collectives (call ", call, "): rank ", e.rank, " ",
                         mine, ", rank ", e.peer, " ", describe_fingerprint(theirs))};
    };
    // The barrier kernels see a hash of the peer's fingerprint only: the peer posted the whole.
    if (e.code == ErrorWord::kMismatch) return mismatch(p ? p->peer_fingerprint : 0);
    // A peer that waits in the same call with another fingerprint took another kind of kernel.
    if (e.code == ErrorWord::kTimeout && p && p->peer_call == call &&
        p->peer_fingerprint != fingerprint && p->peer_fingerprint != 0)
      return mismatch(p->peer_fingerprint);
    const bool peer_started = !p || static_cast<std::int32_t>(p->peer_op - p->op) >= 0;
    std::string message = detail::concat(
        "custom all-reduce: rank ", e.rank,
        e.code == ErrorWord::kAborted ? " was aborted while waiting for rank "
                                      : " timed out waiting for rank ",
        e.peer, " in call ", call, " (", mine, "; block ", e.block,
        p ? detail::concat(", operation ", p->op) : std::string(), "), which ",
        !p ? std::string("may or may not have started it (its progress is unreadable)")
        : peer_started
            ? std::string("had started it (it waits for another rank, or stopped)")
            : detail::concat("had not started it (its last was operation ", p->peer_op, ")"));
    if (p && p->peer_call != call && p->peer_fingerprint != 0)
      message += detail::concat("; rank ", e.peer, "'s kernels last started call ", p->peer_call,
                                " (", describe_fingerprint(p->peer_fingerprint), ")");
    if (!peer_started && peers_in_process)
      message +=
          ". Ranks that share a process: a kernel launched for the first time on a stream while "
          "its peers wait can hold that stream until they give up; launch each of your kernels "
          "once on every stream before its first collective (README, 'Ranks that share a "
          "process')";
    return {e.code == ErrorWord::kAborted ? Status::kAborted : Status::kTimeout,
            std::move(message)};
  }

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
    p.fingerprint = tag.fingerprint;
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

Status CustomAllReduce::kernel_failure(std::string* message) noexcept {
  Impl& m = *impl_;
  const volatile ErrorWord* e = m.error_host;
  if (e->code == 0) return Status::kOk;
  std::lock_guard lock(m.failure_mu);
  if (m.failure == Status::kOk) {
    const ErrorWord word{e->code, e->rank, e->peer, e->block, e->counter, e->abort, e->failed};
    try {
      std::tie(m.failure, m.failure_message) = m.describe(word, m.side_stream);
    } catch (...) {  // the message could not be built; the status stands
      m.failure = word.code == ErrorWord::kAborted ? Status::kAborted : Status::kTimeout;
    }
  }
  if (message != nullptr) *message = m.failure_message;
  return m.failure;
}

Status CustomAllReduce::health() noexcept {
  if (health_ != Status::kOk) return health_;
  std::string message;
  const Status s = kernel_failure(&message);
  if (s == Status::kOk) return s;
  health_ = s;
  error_message_ = std::move(message);
  TPCOMM_LOG_ERROR(error_message_);
  return health_;
}

Status CustomAllReduce::warm_up(Stream stream) noexcept {
  Impl& m = *impl_;
  if (std::find(m.warm_streams.begin(), m.warm_streams.end(), stream) != m.warm_streams.end())
    return Status::kOk;
  if (Status h = health(); h != Status::kOk) return h;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TPCOMM_CUDA_TRY(cudaStreamIsCapturing(s, &capture));
  // A stream first used inside a capture cannot be synchronised: its kernels stay cold there.
  if (capture != cudaStreamCaptureStatusNone) return Status::kOk;
  if (launch_every_kernel(m.world, stream) != Status::kOk) return Status::kCudaError;
  TPCOMM_CUDA_TRY(cudaStreamSynchronize(s));
  try {
    // Bounded by the group's deadline, not the bootstrap's (which may be much longer).
    m.boot->barrier(
        std::chrono::duration_cast<Milliseconds>(std::chrono::nanoseconds(m.timeout_ns)));
  } catch (const Error& err) {
    health_ = err.status();
    error_message_ = detail::concat("custom all-reduce: warming up a new stream: ", err.what(),
                                    " (every rank must start using a new stream at the same call)");
    return health_;
  }
  m.warm_streams.push_back(stream);
  return Status::kOk;
}

void CustomAllReduce::abort_kernels() noexcept {
  std::atomic_ref<std::uint32_t>(impl_->error_host->abort).store(1, std::memory_order_release);
}

void CustomAllReduce::abort() noexcept {
  Impl& m = *impl_;
  abort_kernels();
  // Kernels that never wait (their peers' data already there) would not see the abort flag:
  // mark the rank failed on the device too, so that every later kernel, a graph's above all,
  // gives up at its start (NOTE [bounded waits]). The copy engine does it beside the kernels.
  auto* pad = reinterpret_cast<SignalPad*>(m.workspaces[m.rank] + m.layout.signal);
  std::lock_guard lock(m.failure_mu);  // the side stream's other user
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(m.device) == cudaSuccess) {
    if (cudaMemcpyAsync(&pad->failed, &m.error_host->abort, sizeof(pad->failed),
                        cudaMemcpyHostToDevice, m.side_stream) == cudaSuccess)
      cudaStreamSynchronize(m.side_stream);
    cudaSetDevice(previous);
  }
  if (health_ == Status::kOk) {
    health_ = Status::kAborted;
    error_message_ = "custom all-reduce: aborted";
  }
}

bool CustomAllReduce::early_launch(int blocks, int group) const noexcept {
  int room = caps_.max_blocks;
  if (group > 1) room = std::min(room, caps_.max_cluster_blocks[cluster_index(group)]);
  return 2 * blocks <= room;
}

Status CustomAllReduce::run(const TensorView& in, const TensorView& out, Choice choice,
                            bool capturing, Stream stream, const CallTag& tag,
                            const kernels::FusionParams* fusion) noexcept {
  Impl& m = *impl_;
  kernels::AllReduceParams p = m.params(in, out, tag);
  if (fusion != nullptr) p.fusion = *fusion;
  // Lamport always copies the input into the peers' buffers: nothing to register.
  const kernels::KernelId kernel = info(choice.algo).kernel;
  if (capturing && capture_open_ && !kernels::pushes(kernel) &&
      in.nbytes() >= m.register_min_bytes) {
    // Registered (NOTE [staging]): the slot is filled when the scope closes.
    if (next_slot_ >= kRegistrySlots) return Status::kUnsupported;
    p.registered = m.registry + next_slot_;
    p.end_barrier = true;
    const bool read_in_place = in.data != out.data && in.is_aligned(16);
    m.recorded.push_back(read_in_place ? in.data : nullptr);
    ++next_slot_;
  }
  const int group = fusion != nullptr && kernels::traits(fusion->kind).norm
                        ? kernels::row_group(choice.blocks, in.numel() / fusion->hidden)
                        : 1;
  p.early_launch = early_launch(choice.blocks, group);
  return kernels::launch_all_reduce(p, kernel, choice.shape(), m.programmatic, stream);
}

Status CustomAllReduce::exchange(const ExchangePlan& plan, const TensorView& in,
                                 const TensorView& out, ExchangeChoice choice, bool capturing,
                                 Stream stream, const CallTag& tag) noexcept {
  Impl& m = *impl_;
  kernels::ExchangeParams p{};
  p.fingerprint = tag.fingerprint;
  p.call = tag.call;
  p.input = in.data;
  p.input_bytes = plan.input_bytes;
  p.output = out.data;
  for (int r = 0; r < m.world; ++r) {
    p.staging[r] = m.exchange_staging[r];
    p.pads[r] = reinterpret_cast<SignalPad*>(m.workspaces[r] + m.layout.signal);
    p.from[r] = plan.from[r];
  }
  p.half_bytes = m.exchange_half;
  p.rank = m.rank;
  p.world_size = m.world;
  p.timeout_ns = m.timeout_ns;
  p.error = m.error_dev;
  bool stage = true;
  // Registered (NOTE [staging]) where the input is large enough that the end barrier costs less
  // than the staging copy, like the all-reduce; the slot is filled when the scope closes. The
  // threshold is the same on every rank; an input the kernel cannot read in place is still
  // staged, by this rank alone.
  if (capturing && capture_open_ && plan.largest_input >= m.register_min_bytes) {
    if (next_slot_ >= kRegistrySlots) return Status::kUnsupported;
    p.registered = m.registry + next_slot_;
    p.end_barrier = true;
    stage = !in.is_aligned(16) || overlaps(in, out);
    m.recorded.push_back(stage ? nullptr : in.data);
    ++next_slot_;
  }
  p.early_launch = early_launch(choice.blocks, 1);
  return kernels::launch_exchange(p, choice.shape(), stage, m.programmatic, stream);
}

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

TuneTable CustomAllReduce::tune(const TuneKey& key) {
  constexpr int kOpsPerGraph = 20;
  constexpr int kReplays = 5;
  Impl& m = *impl_;
  DeviceGuard guard(m.device);
  struct Resources {
    // The input, the output (residual_out), and the fused operation's residual, gamma, norm_out.
    std::array<void*, 5> buffers{};
    cudaStream_t stream = nullptr;
    ~Resources() {
      for (void* p : buffers) cudaFree(p);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  } r;
  const auto most = static_cast<std::size_t>(std::max(caps_.max_bytes, caps_.exchange_max_bytes));
  for (void*& p : r.buffers) {
    TPCOMM_CUDA_CHECK(cudaMalloc(&p, most));
    TPCOMM_CUDA_CHECK(cudaMemset(p, 0, most));
  }
  void* in = r.buffers[0];
  void* out = r.buffers[1];
  TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  const auto stream = reinterpret_cast<Stream>(r.stream);
  if (Status w = warm_up(stream); w != Status::kOk) TPCOMM_THROW(w, "tuning: ", error_message_);
  // Never time on zeros.
  TPCOMM_CHECK(kernels::fill_data(in, DType::kBF16, caps_.max_bytes / 2, 2024, m.rank,
                                  ReduceOp::kSum, 0, stream) == Status::kOk,
               Status::kCudaError, "tuning: filling the input failed");
  // `kOpsPerGraph` launches of `launch()` captured, replayed and timed: microseconds each.
  auto time_ops = [&](const auto& c, auto&& launch) {
    GraphTimer graph(stream);  // destroyed on return, before the collective that follows
    std::string failure = graph.capture([&] {
      for (int i = 0; i < kOpsPerGraph; ++i)
        if (Status s = launch(); s != Status::kOk)
          return detail::concat("launching ", to_string(c), " failed: ", to_string(s));
      return std::string();
    });
    double us = 0;
    if (failure.empty()) failure = graph.time(*m.boot, kReplays, &us);
    if (Status h = health(); h != Status::kOk) TPCOMM_THROW(h, "tuning: ", error_message_);
    TPCOMM_CHECK(failure.empty(), Status::kCudaError, "tuning: ", failure);
    return us / kOpsPerGraph;
  };
  auto time = [&](const Choice& c, std::int64_t bytes) {
    const auto iv = TensorView::flat(in, DType::kBF16, bytes / 2, m.device);
    const auto ov = TensorView::flat(out, DType::kBF16, bytes / 2, m.device);
    const CallTag tag{fingerprint(Op::kAllReduce, DType::kBF16, bytes / 2)};
    return time_ops(c, [&] { return run(iv, ov, c, /*capturing=*/false, stream, tag); });
  };
  auto time_fused = [&](const Choice& c, std::int64_t bytes) {
    const std::int64_t hidden = tune_fused_hidden(bytes);
    const std::int64_t count = std::max<std::int64_t>(1, bytes / 2 / hidden) * hidden;
    kernels::FusionParams f{};
    f.kind = kernels::Fusion::kAddRmsNorm;
    f.residual = r.buffers[2];
    f.gamma = r.buffers[3];
    f.norm_out = r.buffers[4];
    f.eps = 1e-6f;
    f.hidden = hidden;
    const auto iv = TensorView::flat(in, DType::kBF16, count, m.device);
    const auto ov = TensorView::flat(out, DType::kBF16, count, m.device);
    const CallTag tag{fingerprint(Op::kAllReduceAddRmsNorm, DType::kBF16, count,
                                  fused_shape(static_cast<int>(f.kind), 0, hidden))};
    if (c.algo != Algo::kNone)
      return time_ops(c, [&] { return run(iv, ov, c, /*capturing=*/false, stream, tag, &f); });
    // The fallback: the built-in all-reduce into residual_out, then the local kernel there.
    const Choice reduce =
        select_all_reduce(count * 2, DType::kBF16, ReduceOp::kSum, caps_, {}, nullptr);
    TPCOMM_CHECK(reduce.algo != Algo::kNone, Status::kInternal, "tuning: no all-reduce for ",
                 count * 2, " bytes");
    return time_ops(c, [&] {
      TPCOMM_TRY(run(iv, ov, reduce, /*capturing=*/false, stream, tag));
      return kernels::launch_add_rmsnorm(out, out, f, count, DType::kBF16, stream);
    });
  };
  // The exchanges: an equal-split all-to-all whose every rank's input is `bytes` (in whole
  // 16-byte accesses per chunk).
  auto time_exchange = [&](const ExchangeChoice& c, std::int64_t bytes) {
    const std::int64_t chunk = std::max<std::int64_t>(16, bytes / m.world / 16 * 16);
    const ExchangePlan plan = plan_all_to_all(chunk * m.world, m.world, m.rank);
    const auto iv = TensorView::flat(in, DType::kU8, chunk * m.world, m.device);
    const auto ov = TensorView::flat(out, DType::kU8, chunk * m.world, m.device);
    const CallTag tag{fingerprint(Op::kAllToAll, DType::kU8, chunk * m.world)};
    return time_ops(c, [&] { return exchange(plan, iv, ov, c, /*capturing=*/false, stream, tag); });
  };
  TuneTable plain = tune_all_reduce(caps_, *m.boot, key, time);
  std::vector<TuneEntry> fused = tune_fused(caps_, *m.boot, time_fused);
  return TuneTable(key, plain.entries(), std::move(fused),
                   tune_exchange(caps_, *m.boot, time_exchange));
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
