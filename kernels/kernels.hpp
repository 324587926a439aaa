// SPDX-License-Identifier: Apache-2.0
// Host-visible declarations of every kernel launcher. No CUDA syntax: host code includes this.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ipc/layout.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::kernels {

/// The quantisation of a fused operation's normalised output.
enum class Quant : std::uint8_t {
  kNone,      // the input's dtype
  kFp8,       // f8e4m3, saturate(value / scale) with the caller's per-tensor scale
  kFp8Token,  // f8e4m3 with a per-row scale amax / 448, written out
  kFp8Group,  // f8e4m3 with a scale amax / 448 per group of kFp8Group elements of a row, written
};

/// Elements of a row that share one scale under Quant::kFp8Group (DeepSeek's block
/// quantisation); the row's length must be a multiple of it.
inline constexpr int kFp8Group = 128;

/// The normalisation of a fused operation's rows; each kind's arithmetic is a `RowNorm`
/// specialisation in kernels/common/epilogue.cuh.
enum class Norm : std::uint8_t {
  kNone,  // no row step: the sum (plus the residual) is all that is stored
  kRms,   // RMSNorm: x * rsqrt(mean(x^2) + eps) * gamma
};

/// What an epilogue does (NOTE [epilogues] in kernels/common/epilogue.cuh), fixed at compile time:
/// add the residual (when the call gives one), normalise each row (its kind, times gamma), and
/// how to store the normalised rows.
struct FusionTraits {
  /// The MoE combine is the prologue: each rank's input packs are combined from its experts'
  /// outputs (`FusionParams::moe`, as `launch_moe_combine` does, rounded once into the input's
  /// dtype) as the kernel pushes them, instead of read from its input.
  bool combine = false;
  bool residual = false;
  Norm norm = Norm::kNone;
  Quant quant = Quant::kNone;
  /// The epilogue has a row step (NOTE [epilogues]): it normalises.
  [[nodiscard]] constexpr bool rows() const noexcept { return norm != Norm::kNone; }
  friend constexpr bool operator==(const FusionTraits&, const FusionTraits&) = default;
};

/// The epilogues that are instantiated, by name. The Lamport kernels carry every one but `kAdd`;
/// the local kernel (`launch_add_rmsnorm`) every one but `kNone` and those with the combine. The
/// forms of the norm that do not change what is stored (no residual, an f32 gamma, Gemma's `1 +
/// gamma`) are arguments
/// (`FusionParams`), not epilogues.
enum class Fusion : std::uint8_t {
  kNone,                // the plain all-reduce
  kAddRmsNorm,          // residual_out = sum + residual; norm_out = RMSNorm(residual_out) * gamma
  kAddRmsNormFp8,       // the same, norm_out in f8e4m3 with a per-tensor scale
  kAddRmsNormFp8Token,  // the same, norm_out in f8e4m3 with per-row scales
  kAddRmsNormFp8Group,  // the same, norm_out in f8e4m3 with a scale per kFp8Group elements
  kAdd,                 // residual_out = sum + residual, no norm
  kMoeAddRmsNorm,       // kAddRmsNorm of the sum of every rank's MoE combine (the prologue)
};

/// True for the values of `Fusion`. The switch has no default: a new value is a -Wswitch warning
/// (an error under TPCOMM_WERROR) until it is listed here, and then a failed static_assert below
/// until `kFusionCount` counts it.
constexpr bool is_fusion(Fusion f) noexcept {
  switch (f) {
    case Fusion::kNone:
    case Fusion::kAddRmsNorm:
    case Fusion::kAddRmsNormFp8:
    case Fusion::kAddRmsNormFp8Token:
    case Fusion::kAddRmsNormFp8Group:
    case Fusion::kAdd:
    case Fusion::kMoeAddRmsNorm:
      return true;
  }
  return false;
}

/// The number of `Fusion` values, which run from 0 to `kFusionCount - 1` (the dispatch and the
/// warm-up walk them by number).
inline constexpr int kFusionCount = 7;
static_assert(
    [] {
      for (int f = 0; f < kFusionCount; ++f)
        if (!is_fusion(static_cast<Fusion>(f))) return false;
      return !is_fusion(static_cast<Fusion>(kFusionCount));
    }(),
    "kFusionCount counts every Fusion value, numbered from 0 without gaps");

constexpr FusionTraits traits(Fusion f) noexcept {
  switch (f) {
    case Fusion::kNone:
      return {};
    case Fusion::kAddRmsNorm:
      return {false, true, Norm::kRms, Quant::kNone};
    case Fusion::kAddRmsNormFp8:
      return {false, true, Norm::kRms, Quant::kFp8};
    case Fusion::kAddRmsNormFp8Token:
      return {false, true, Norm::kRms, Quant::kFp8Token};
    case Fusion::kAddRmsNormFp8Group:
      return {false, true, Norm::kRms, Quant::kFp8Group};
    case Fusion::kAdd:
      return {false, true, Norm::kNone, Quant::kNone};
    case Fusion::kMoeAddRmsNorm:
      return {true, true, Norm::kRms, Quant::kNone};
  }
  return {};
}

/// An all-reduce kernel (`kernels/all_reduce_<name>.cu` and its `.cuh`) as the registry of
/// algorithms (src/tune/algorithms.hpp) names it in the row of the algorithm it runs: where its
/// instantiations are and how it moves data. Which algorithm runs it, where it fits and how it is
/// tuned is the registry's business; this layer knows only what each kernel needs.
struct AllReduceKernel {
  /// The kernel function for a dtype, a world size and an epilogue (NOTE [epilogues] in
  /// kernels/common/epilogue.cuh), or nullptr where it has none; defined in the kernel's own
  /// `.cu` file with `find_instance` (kernels/common/dispatch.cuh).
  const void* (*instance)(DType dtype, int world_size, Fusion fusion) noexcept;
  /// It pushes into the Lamport receive buffers (NOTE [lamport] in ipc/layout.hpp) instead of
  /// reading peers' inputs between barriers; 16-bit types only.
  bool pushes;
  /// Each rank reduces one slice of 1 / world size of the message.
  bool sliced;
};

/// True for the kernels that push into the Lamport receive buffers.
constexpr bool pushes(const AllReduceKernel& k) noexcept { return k.pushes; }

/// True for the kernels in which each rank reduces one slice of 1 / world size of the message.
constexpr bool sliced(const AllReduceKernel& k) noexcept { return k.sliced; }

/// True for the kernels that carry the fused epilogues (`on_lamport`): the Lamport ones.
constexpr bool fuses(const AllReduceKernel& k) noexcept { return k.pushes; }

/// True for the kernels that can end a fused call with the owner of each slice
/// (`AllReduceParams::scattered`): the Lamport two-shot.
constexpr bool scatters(const AllReduceKernel& k) noexcept { return k.pushes && k.sliced; }

/// Bytes of every Lamport slot that kernel `k` needs for a message of `bytes` bytes among
/// `world_size` ranks; 0 for the kernels that do not push.
constexpr std::int64_t lamport_slot_need(const AllReduceKernel& k, std::int64_t bytes,
                                         int world_size) noexcept {
  if (!k.pushes) return 0;
  return k.sliced ? lamport_two_shot_slot_bytes(bytes, world_size) : bytes;
}

/// Most threads per block of the Lamport kernels (`pushes`), plain or fused: a thread polls a pack
/// of every rank at once, and a fused row step keeps packs of a row, in registers; 512 threads
/// leave room for 128 registers a thread (1024 would cap them at 64, and the 8-rank kernels would
/// spill).
inline constexpr int kLamportMaxThreads = 512;

/// Most threads per block of a kernel with a fused epilogue (all of them Lamport kernels).
inline constexpr int kFusedMaxThreads = kLamportMaxThreads;

/// Most threads per block of kernel `k`.
constexpr int max_threads(const AllReduceKernel& k) noexcept {
  return k.pushes ? kLamportMaxThreads : 1024;
}

/// True for the epilogues the Lamport kernels carry.
constexpr bool on_lamport(Fusion f) noexcept { return f != Fusion::kAdd; }

/// Most experts per token the MoE combine takes (top-k).
inline constexpr int kMoeMaxTopK = 32;
/// The widest row the combine kernel takes (its grid's second dimension counts slices of 128).
inline constexpr std::int64_t kMoeMaxHidden = std::int64_t{65535} * 128;

/// The MoE layer's combine: `out[t] = sum over k of weights[t, k] * experts[map[t, k]]`, then
/// `+ shared[t]` where given, per token t of `tokens` and element of `hidden`, accumulated in f32
/// in that order and rounded once into `dtype` (f16, bf16 or f32). `experts` is
/// [rows, hidden] and `shared` [tokens, hidden] in `dtype`; `map` is int32 [tokens, top_k];
/// `weights` [tokens, top_k] in f32 (`weights_f32`) or `dtype`. A map entry outside [0, rows)
/// makes that token's row NaN. Any alignment; `out` must not overlap the inputs.
struct MoeCombineParams {
  const void* experts;
  const std::int32_t* map;
  const void* weights;
  const void* shared;
  void* out;
  std::int64_t tokens;
  std::int64_t rows;
  std::int64_t hidden;
  int top_k;
  bool weights_f32;
};
static_assert(std::is_trivially_copyable_v<MoeCombineParams>);

/// The arguments of a fused operation over `count / hidden` rows of `hidden` elements; unused
/// (zero) for the plain all-reduce. The sum (plus the residual) is the kernel's `output`
/// (`residual_out`).
struct FusionParams {
  Fusion kind;
  /// [rows, hidden] in the input's dtype, any alignment; may be the output (in place). Null: no
  /// residual (a model's first layer), and `residual_out` is the sum itself.
  const void* residual;
  /// [hidden] in the input's dtype, or f32 with `gamma_f32`.
  const void* gamma;
  /// [rows, hidden]: the input's dtype, or f8e4m3 when quantised; may be the input (in place).
  void* norm_out;
  /// Quant::kFp8: one f32 in device memory, read when the kernel runs.
  const float* scale;
  /// Written, f32: Quant::kFp8Token [rows]; Quant::kFp8Group [rows, hidden / kFp8Group].
  float* row_scales;
  float eps;
  std::int64_t hidden;
  /// `gamma` is f32 while the input is 16-bit (a norm weight kept in full precision).
  bool gamma_f32;
  /// The row is scaled by `1 + gamma` (Gemma's RMSNorm) instead of `gamma`.
  bool gamma_plus_one;
  /// With the combine (`FusionTraits::combine`): its arguments (`out` unused; 16-bit experts,
  /// `hidden` as above, `tokens * hidden` the message's count).
  MoeCombineParams moe;
};
static_assert(std::is_trivially_copyable_v<FusionParams>);

/// Most blocks that share a row of a fused operation: the portable thread-block cluster size.
inline constexpr int kMaxRowGroup = 8;

/// Blocks per rank's kernel and threads per block; for a fused kernel with a row step, the
/// blocks that share each row (`group`, the kernel's thread-block cluster: 1, 2, 4 or up to
/// kMaxRowGroup, dividing `blocks`). Blocks past rows x `group` only push (NOTE [row groups] in
/// kernels/common/epilogue.cuh).
struct LaunchShape {
  int blocks = 0;
  int threads = 0;
  int group = 1;
};

/// True for a `LaunchShape::group` the kernels take with `blocks` blocks: a power of two up to
/// kMaxRowGroup that divides them.
constexpr bool is_valid_group(int group, int blocks) noexcept {
  return group >= 1 && group <= kMaxRowGroup && (group & (group - 1)) == 0 && blocks % group == 0;
}

/// Everything one rank's all-reduce kernel needs; passed by value.
struct AllReduceParams {
  /// Every rank's input as mapped here, in device memory filled when a capture scope closes
  /// (NOTE [staging]); a null entry reads that rank's staging half. Null when every rank's
  /// input is staged (eager calls, small captured calls).
  const RankPtrs* registered;
  /// This rank's own input, copied into its staging half when its entry is null.
  const void* input;
  /// This rank's output; any alignment.
  void* output;
  /// Every rank's workspace base (a `WorkspaceLayout`) as mapped here.
  char* workspaces[kMaxRanks];
  /// Every rank's signal pad (`workspaces[r] + layout.signal`). Kernels index it by thread, and
  /// an array indexed at run time must stay in parameter space: a copy in the kernel would
  /// live in local memory, on the critical path of every barrier.
  SignalPad* pads[kMaxRanks];
  WorkspaceLayout layout;
  /// Elements to reduce.
  std::int64_t count;
  DType dtype;
  int rank;
  int world_size;
  /// Run the end barrier (registered inputs must stay untouched until every peer has read).
  bool end_barrier;
  /// Let the next kernel on the stream be scheduled once the last wait is passed: where every
  /// rank sharing the GPU holds room for two kernels at once (NOTE [programmatic launch]).
  bool early_launch;
  /// The reduce-scatter form of a fused call (`scatters(kernel)`, a row epilogue only): rank r's
  /// outputs (`output`, the fusion's residual, `norm_out` and row scales) hold rows
  /// [r, r + 1) * rows / world_size of the message alone, finished where their slice is reduced
  /// (NOTE [scattered rows] in kernels/all_reduce_lamport_two_shot.cuh). `count` is still the
  /// whole message's, a multiple of world_size * hidden whose slices start on pack boundaries.
  bool scattered;
  /// Give up waiting for a peer after this many nanoseconds (0 = never).
  std::uint64_t timeout_ns;
  /// Host-mapped error report and abort flag (NOTE [bounded waits], kernels/common/sync.cuh).
  ErrorWord* error;
  /// The call's fingerprint and the group's call number (NOTE [fingerprints]).
  std::uint64_t fingerprint;
  std::uint32_t call;
  /// The epilogue and its arguments (Lamport kernels only).
  FusionParams fusion;
};
static_assert(std::is_trivially_copyable_v<AllReduceParams>);

/// The kernel function of `kernel` for `dtype` and `world_size` ranks, with the epilogue
/// `fusion`; nullptr where it has none (an unsupported dtype or world size, f32 for the kernels
/// that push, a fusion on the kernels that read peers' inputs; a program without the kernels).
inline const void* kernel_function(const AllReduceKernel& kernel, DType dtype, int world_size,
                                   Fusion fusion = Fusion::kNone) noexcept {
  return kernel.instance != nullptr ? kernel.instance(dtype, world_size, fusion) : nullptr;
}

/// Launches `kernel` with the epilogue `params.fusion.kind` on `stream` with `shape`; with
/// `programmatic`, as a programmatic dependent launch (NOTE [programmatic launch] in
/// kernels/common/sync.cuh). `params.count` 0 launches it with nothing to do (NOTE [first
/// launch] in backends/custom_ar.cpp). kInvalidArgument for an unsupported dtype/world
/// size/launch shape/fusion, or a message the Lamport slots cannot hold; kCudaError when the
/// launch fails. Sum only; world sizes 2..8.
Status launch_all_reduce(const AllReduceParams& params, const AllReduceKernel& kernel,
                         LaunchShape shape, bool programmatic, Stream stream) noexcept;

/// The local half of the fused operation, for where no Lamport kernel serves it: from `sum`
/// ([rows, hidden] in `dtype`, f16 or bf16 or f32), the epilogue `fusion.kind` (not kNone)
/// writes `residual_out` and `fusion.norm_out`, one block per row. `sum` may be `residual_out`,
/// and `norm_out` may be `sum`. `count` 0 is a warm-up launch. kInvalidArgument for an
/// unsupported dtype or fusion; kCudaError when the launch fails.
Status launch_add_rmsnorm(const void* sum, void* residual_out, const FusionParams& fusion,
                          std::int64_t count, DType dtype, Stream stream) noexcept;

/// Launches the MoE combine (one block per token and slice of the row). `tokens` 0 is a warm-up
/// launch. kInvalidArgument for an unsupported dtype, a top-k outside 1..kMoeMaxTopK or a hidden
/// over kMoeMaxHidden; kCudaError when the launch fails.
Status launch_moe_combine(const MoeCombineParams& params, DType dtype, Stream stream) noexcept;

/// Fills `bytes` bytes (a multiple of 16, 16-byte aligned) of Lamport buffers with the empty
/// mark (NOTE [lamport] in ipc/layout.hpp).
Status fill_lamport_empty(void* buffers, std::int64_t bytes, Stream stream) noexcept;

/// Most blocks of `threads` threads of `kernel` with the epilogue `fusion` that one SM can hold
/// at once (occupancy); 0 where the kernel has no such instantiation for `dtype` and
/// `world_size`.
int max_blocks_per_sm(const AllReduceKernel& kernel, DType dtype, int world_size, int threads,
                      Fusion fusion = Fusion::kNone) noexcept;

/// Most thread-block clusters of `cluster` blocks of `threads` threads of `kernel` with the
/// epilogue `fusion` that the GPU holds at once (its GPCs hold a whole number of clusters each);
/// 0 where the kernel has no such instantiation or the GPU no such clusters.
int max_active_clusters(const AllReduceKernel& kernel, DType dtype, int world_size, int threads,
                        Fusion fusion, int cluster) noexcept;

// ---- the exchange: all-gather, all-to-all and the LM-head exchange ----------------------

/// What one rank copies from one source rank in an exchange: `rows` rows of `row_bytes` bytes,
/// row i read at byte `src_offset + i * src_pitch` of the source's input and written at byte
/// `dst_offset + i * dst_pitch` of this rank's output. All in bytes; `rows` 0 copies nothing.
struct CopyRegion {
  std::int64_t src_offset;
  std::int64_t src_pitch;
  std::int64_t dst_offset;
  std::int64_t dst_pitch;
  std::int64_t rows;
  std::int64_t row_bytes;
};
static_assert(std::is_trivially_copyable_v<CopyRegion>);

/// Everything one rank's exchange kernel needs; passed by value (NOTE [exchange] in
/// kernels/exchange.cu).
struct ExchangeParams {
  /// Every rank's input as mapped here, filled when a capture scope closes; a null entry (or a
  /// null `registered`) reads that rank's staging half (NOTE [staging] in ipc/layout.hpp).
  const RankPtrs* registered;
  /// This rank's whole input, `input_bytes` bytes, any alignment: what its peers read from.
  const void* input;
  std::int64_t input_bytes;
  /// This rank's output; any alignment.
  void* output;
  /// Every rank's staging buffer (two halves of `half_bytes`) as mapped here.
  char* staging[kMaxRanks];
  std::int64_t half_bytes;
  /// Every rank's signal pad as mapped here (kept in parameter space, as in AllReduceParams).
  SignalPad* pads[kMaxRanks];
  /// What this rank reads from each rank (itself included).
  CopyRegion from[kMaxRanks];
  /// The push form only (`launch_exchange_push`): what each rank reads from this one (its
  /// `from[rank]`); the source side of each region is used.
  CopyRegion to[kMaxRanks];
  /// The push form only: every rank's workspace base as mapped here, and its layout, for the
  /// Lamport receive buffers (NOTE [exchange push] in kernels/exchange_push.cu).
  char* workspaces[kMaxRanks];
  WorkspaceLayout layout;
  int rank;
  int world_size;
  /// Run the end barrier (registered inputs must stay untouched until every peer has read).
  bool end_barrier;
  /// Let the next kernel on the stream be scheduled once the last wait is passed: where every
  /// rank sharing the GPU holds room for two kernels at once (NOTE [programmatic launch]).
  bool early_launch;
  /// Give up waiting for a peer after this many nanoseconds (0 = never).
  std::uint64_t timeout_ns;
  ErrorWord* error;
  /// The call's fingerprint and the group's call number (NOTE [fingerprints]).
  std::uint64_t fingerprint;
  std::uint32_t call;
  /// What a block that gives up writes, as 8 bytes of the output from an offset that is a
  /// multiple of 8 (`poison_pattern` of the elements' type; NOTE [poisoned outputs]).
  std::uint64_t poison;
};
static_assert(std::is_trivially_copyable_v<ExchangeParams>);

/// The poison of elements of `dtype` (NOTE [poisoned outputs] in kernels/common/poison.cuh), as
/// the 8 bytes of memory that hold 8 / size of them (little-endian): all-one bytes (NaN in every
/// floating type, the largest value in unsigned ones), and in signed integers the most negative
/// value, which no index or id means ("none" is -1 there).
constexpr std::uint64_t poison_pattern(DType dtype) noexcept {
  switch (dtype) {
    case DType::kI8:
      return 0x8080808080808080ull;
    case DType::kI32:
      return 0x8000000080000000ull;
    case DType::kI64:
      return 0x8000000000000000ull;
    default:
      return ~std::uint64_t{0};
  }
}

/// Launches one rank's exchange on `stream`: with `stage`, first a kernel that copies `input`
/// into this rank's staging half of this operation, then the exchange kernel (one barrier, then
/// every region of `from` copied; with `end_barrier` a second barrier). As a programmatic
/// dependent launch with `programmatic`. Every rank launches the same grid. kInvalidArgument
/// for a world size outside 2..8, a bad launch shape or a region of 2^32 accesses or more;
/// kCudaError when a launch fails.
Status launch_exchange(const ExchangeParams& params, LaunchShape shape, bool stage,
                       bool programmatic, Stream stream) noexcept;

/// Launches one rank's exchange in the push form on `stream` (NOTE [exchange push] in
/// kernels/exchange_push.cu): this rank's regions of `to` written into its slot of every peer's
/// Lamport buffer as lines of 8 bytes and two flag words, its own region copied, then every
/// region of `from` taken from its own buffer as it arrives. No staging, no barrier. Every rank
/// launches the same grid. kInvalidArgument for a world size outside 2..8, a bad launch shape, a
/// region whose rows are not whole 4-byte words, or one that the Lamport slots cannot hold
/// (`exchange_push_slot_bytes`); kCudaError when the launch fails.
Status launch_exchange_push(const ExchangeParams& params, LaunchShape shape, bool programmatic,
                            Stream stream) noexcept;

/// Bytes of a Lamport slot that the push form needs to carry `bytes` bytes (a multiple of 4):
/// a 16-byte line per 8 bytes.
constexpr std::int64_t exchange_push_slot_bytes(std::int64_t bytes) noexcept {
  return (bytes + 7) / 8 * 16;
}
static_assert(exchange_push_slot_bytes(4) == 16 && exchange_push_slot_bytes(1024) == 2048);

/// A local copy of up to kMaxRanks regions in one launch: region i of `from` read from
/// `sources[i]`, written into `output` (the LM-head exchange's fallback after its all-gather).
struct RegionCopyParams {
  const char* sources[kMaxRanks];
  void* output;
  CopyRegion from[kMaxRanks];
  int regions;
};
static_assert(std::is_trivially_copyable_v<RegionCopyParams>);

/// Launches the copy of `params` on `stream`; `params.regions` 0 is a warm-up launch.
/// kInvalidArgument for more than kMaxRanks regions or one of 2^32 accesses or more; kCudaError
/// when the launch fails.
Status launch_region_copy(const RegionCopyParams& params, Stream stream) noexcept;

/// Launches every exchange kernel of `world_size` ranks once on `stream` with nothing to do
/// (NOTE [first launch] in backends/custom_ar.cpp).
Status warm_up_exchange(int world_size, Stream stream) noexcept;

/// Most blocks of `threads` threads of the exchange kernels (both forms) of `world_size` ranks
/// that one SM holds at once; 0 for a world size outside 2..8.
int exchange_max_blocks_per_sm(int world_size, int threads) noexcept;

}  // namespace tpcomm::kernels
