// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce's launches: warming streams up, the launch limits of ranks that share a
// GPU, running the all-reduce and the exchange (the workspace, the peers and the registration of
// captured buffers are in custom_ar_buffers.cpp, the failure report in custom_ar_failure.cpp, the
// tuner in custom_ar_tune.cpp).
#include "backends/custom_ar.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "backends/custom_ar_impl.hpp"
#include "backends/exchange_plan.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
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

int CustomAllReduce::Impl::resident_blocks(int sharing) const {
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

ClusterBlocks CustomAllReduce::Impl::resident_cluster_blocks(int sharing) const {
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
        clusters = std::min(clusters,
                            kernels::max_active_clusters(a.kernel, DType::kBF16, world,
                                                         kernels::kFusedMaxThreads, fusion, size));
      }
    }
    if (clusters == std::numeric_limits<int>::max()) clusters = 0;
    out[static_cast<std::size_t>(i)] = clusters / std::max(sharing, 1) * size;
  }
  return out;
}

kernels::AllReduceParams CustomAllReduce::Impl::params(const TensorView& in, const TensorView& out,
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
                            const kernels::FusionParams* fusion, bool scattered) noexcept {
  Impl& m = *impl_;
  kernels::AllReduceParams p = m.params(in, out, tag);
  if (fusion != nullptr) p.fusion = *fusion;
  p.scattered = scattered;
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

}  // namespace tpcomm
