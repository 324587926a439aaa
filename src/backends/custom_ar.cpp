// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce: building a rank's share of the group, warming streams up, running the
// all-reduce and the exchange, and capture scopes (the failure report is in custom_ar_failure.cpp,
// the tuner in custom_ar_tune.cpp).
#include "backends/custom_ar.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "backends/custom_ar_impl.hpp"
#include "backends/exchange_plan.hpp"
#include "core/overlap.hpp"

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

/// Launches every kernel a group of `world` ranks may run once on `stream`, each with nothing to
/// do (NOTE [first launch]): every algorithm of the registry for every dtype and epilogue it
/// serves, the local add + RMSNorm, the MoE combine, the Lamport refill and the exchange kernels.
/// (Test data is the tests' and the program's own: they warm it up themselves,
/// kernels/test_data.hpp.)
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
      if (kernels::traits(static_cast<kernels::Fusion>(f)).combine) continue;  // Lamport only
      kernels::FusionParams none{};
      none.kind = static_cast<kernels::Fusion>(f);
      TPCOMM_TRY(kernels::launch_add_rmsnorm(nullptr, nullptr, none, 0, t, stream));
    }
  }
  // The MoE combine before the fused operation (Group::moe_finalize_all_reduce_add_rmsnorm).
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool weights_f32 : {false, true}) {
      kernels::MoeCombineParams none{};
      none.top_k = 1;
      none.weights_f32 = weights_f32;
      TPCOMM_TRY(kernels::launch_moe_combine(none, t, stream));
    }
  }
  TPCOMM_TRY(kernels::fill_lamport_empty(nullptr, 0, stream));
  return kernels::warm_up_exchange(world, stream);
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
  const kernels::AllReduceKernel& kernel = info(choice.algo).kernel;
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
  const int group = fusion != nullptr && kernels::traits(fusion->kind).rows() ? choice.group : 1;
  p.early_launch = early_launch(choice.blocks, group);
  return kernels::launch_all_reduce(p, kernel, choice.shape(), m.programmatic, stream);
}

Status CustomAllReduce::exchange(const ExchangePlan& plan, const TensorView& in,
                                 const TensorView& out, ExchangeChoice choice, bool capturing,
                                 Stream stream, const CallTag& tag) noexcept {
  Impl& m = *impl_;
  kernels::ExchangeParams p{};
  p.fingerprint = keyed_fingerprint(tag);
  p.call = tag.call;
  p.poison = kernels::poison_pattern(in.dtype);
  p.input = in.data;
  p.input_bytes = plan.input_bytes;
  p.output = out.data;
  for (int r = 0; r < m.world; ++r) {
    p.staging[r] = m.exchange_staging[r];
    p.pads[r] = reinterpret_cast<SignalPad*>(m.workspaces[r] + m.layout.signal);
    p.from[r] = plan.from[r];
    p.to[r] = plan.to[r];
    p.workspaces[r] = m.workspaces[r];
  }
  p.layout = m.layout;
  p.half_bytes = m.exchange_half;
  p.rank = m.rank;
  p.world_size = m.world;
  p.timeout_ns = m.timeout_ns;
  p.error = m.error_dev;
  p.early_launch = early_launch(choice.blocks, 1);
  // The push form copies the input into the peers' buffers: nothing to stage or register.
  if (info(choice.algo).lamport)
    return kernels::launch_exchange_push(p, choice.shape(), m.programmatic, stream);
  bool stage = plan.input_bytes > 0;  // nothing to stage for a rank that sends nothing
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
  return kernels::launch_exchange(p, choice.shape(), stage, m.programmatic, stream);
}

Status CustomAllReduce::check_call(const CallTag& tag, Stream stream) noexcept {
  // One block of the pull form's barrier: no regions, nothing staged.
  return exchange(ExchangePlan{}, TensorView{}, TensorView{},
                  ExchangeChoice{ExchangeAlgo::kPull, 1, 32}, false, stream, tag);
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
