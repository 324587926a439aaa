// SPDX-License-Identifier: Apache-2.0
// The group coordinator: one communicator per process group, picking the fastest path.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/lm_head.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

/// Which communicators a group may build. `Options` say what the user allows; this says what
/// the group is for (SGLang gives MoE groups NCCL only, for example).
struct GroupConfig {
  bool custom_all_reduce = true;
  bool nccl = true;
  /// With `custom_all_reduce`: the custom all-reduce carries the Lamport workspace that serves
  /// the fused all-reduce + residual add + RMSNorm (and small plain all-reduces). Without it the
  /// custom all-reduce has no Lamport buffers (saving 3 x world size x
  /// `TPCOMM_LAMPORT_MAX_BYTES` per rank) and fused calls take the fallback (the all-reduce,
  /// then the local `add_rmsnorm`).
  bool fusion = true;
  /// The largest batch the fused operation serves from that workspace, as SGLang sizes its
  /// fusion workspace: up to `fusion_max_tokens` rows of `fusion_hidden` 16-bit elements (the
  /// model's hidden size). -1 (0 for the hidden size) takes `TPCOMM_FUSION_MAX_TOKENS` and
  /// `TPCOMM_FUSION_HIDDEN` (`Options::fusion_max_tokens`, 128 rows of 8192 by default). Every
  /// rank must pass the same values.
  std::int64_t fusion_max_tokens = -1;
  std::int64_t fusion_hidden = 0;
  /// Whether the all-reduces and fused norms are batch-invariant (`Determinism`,
  /// docs/DETERMINISM.md); nullopt takes `TPCOMM_DETERMINISTIC` (`Options::deterministic`), and
  /// `Group::options()` shows the value in force. Every rank must pass the same value.
  std::optional<Determinism> deterministic = std::nullopt;
};

/// A communicator for the ranks of one `Bootstrap`: the ordered backend chain of docs/DESIGN.md
/// §3 (world size 1, then the custom all-reduce, then NCCL, then the composite paths), CUDA-graph
/// capture, and health.
///
/// Collective calls must be made by every rank of the group in the same order with the same
/// sizes, dtypes and shapes; each then takes the same path on every rank. Operations are
/// enqueued on the caller's stream and are CUDA-graph capturable. A group serves one
/// operation at a time: calls made from several streams are ordered one after another (the
/// group makes each new stream wait for the previous one), so use one group per concurrent
/// stream. Not thread-safe: one thread per rank.
///
/// Errors: hot-path calls return a `Status` and never throw. kInvalidArgument leaves the group
/// usable. kTimeout/kAborted/kMismatch/kNcclError make the group unusable: every later call
/// returns that status, `last_error()` says what happened (who waited for whom, or both ranks'
/// calls when the ranks called different collectives), and the caller can build a new group.
/// kUnsupported means no backend could serve the request.
///
/// Failures are noticed without the caller asking: each group runs a watchdog thread that, within
/// milliseconds of a lost rank, a kernel that gave up at its deadline, or ranks whose calls
/// differ, logs the failure and acts as `set_failure_mode` (default `TPCOMM_ASYNC_ERROR_HANDLING`,
/// raise) says. A kernel that cannot complete poisons its outputs (every byte 0xFF: NaN in
/// floating types, -1 in signed integers), so that a result consumed before anyone reads the
/// error, a CUDA graph's replays above all, cannot look plausible; every later kernel of the
/// group does the same at once.
class Group {
 public:
  /// Builds the communicators. Collective over `boot`; the group then keeps a namespace of its
  /// own in the same store, so `boot` need not outlive it. `device` is the CUDA device ordinal
  /// of this rank. Throws `Error` when the group cannot be built at
  /// all; a backend that cannot be built (no NCCL, no peer access) is left out, on every rank
  /// alike, with a log line.
  Group(Bootstrap& boot, int device, Options options = Options::from_env(),
        GroupConfig config = {});
  ~Group();
  Group(Group&&) noexcept;
  Group& operator=(Group&&) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;
  [[nodiscard]] int device() const noexcept;
  [[nodiscard]] const Options& options() const noexcept;

  /// out = reduction of `in` over all ranks. `in` and `out` have the same dtype and number of
  /// elements and are contiguous; `out == in` (in place) is allowed. Any alignment.
  [[nodiscard]] Status all_reduce(const TensorView& in, const TensorView& out, Stream stream,
                                  ReduceOp op = ReduceOp::kSum) noexcept;
  /// out = the concatenation of every rank's `in` (rank order, along the first dimension of
  /// the flattened tensors); out has world_size() times the elements of `in`. Any dtype. Served
  /// over peer memory by the custom exchange (world size 2..8, inputs the exchange's staging
  /// holds, `prepare_exchange`), else by NCCL. In place when `in` is rank()'s block of `out`.
  [[nodiscard]] Status all_gather(const TensorView& in, const TensorView& out,
                                  Stream stream) noexcept;
  /// On rank `root`, out = the concatenation of every rank's `in` (rank order, as `all_gather`;
  /// the logits gather of a tensor-parallel LM head); every rank passes the same number of
  /// elements. Elsewhere `out` is not used (an empty view will do). Any dtype; on the root, in
  /// place when `in` is its block of `out`. Served like `all_gather` (NCCL: grouped sends to the
  /// root).
  [[nodiscard]] Status gather(const TensorView& in, const TensorView& out, int root,
                              Stream stream) noexcept;
  /// out = rank r's slice of the reduction of `in` (`in` has world_size() times the elements of
  /// `out`). Served by NCCL, else by the all-reduce of the whole input into a stream-ordered
  /// temporary and a copy of this rank's slice (`backend_for` says `…+slice`).
  [[nodiscard]] Status reduce_scatter(const TensorView& in, const TensorView& out, Stream stream,
                                      ReduceOp op = ReduceOp::kSum) noexcept;
  /// Equal-split all-to-all over the flattened tensors: chunk j of `in` (numel / world_size
  /// elements) goes to rank j, and chunk i of `out` comes from rank i. Any dtype; `in` and `out`
  /// must not overlap. Served like `all_gather`.
  [[nodiscard]] Status all_to_all(const TensorView& in, const TensorView& out,
                                  Stream stream) noexcept;
  /// All-to-all with per-peer counts: `counts[s * world_size() + d]` elements go from rank s to
  /// rank d. `counts` has world_size()^2 entries, each >= 0, and is the same on every rank (an
  /// engine knows every rank's batch). `in` holds this rank's sends in order of destination
  /// (row `rank()` of `counts` summed), `out` its receives in order of source (column `rank()`
  /// summed); flattened, same dtype, no overlap. Served like `all_gather` (NCCL: grouped
  /// send/receive). The counts are read when the call is made, also under capture.
  [[nodiscard]] Status all_to_all(const TensorView& in, const TensorView& out,
                                  std::span<const std::int64_t> counts, Stream stream) noexcept;
  /// The vocabulary-sharded LM head's exchange (data-parallel attention with a tensor-parallel
  /// LM head, tp == dp): every rank computed logits for every rank's tokens on its vocabulary
  /// shard and gets back its own tokens over the whole vocabulary.
  ///
  /// `shard_logits` is [T, S]: T = the sum of `layout`'s rows, in rank-block order (rank j's
  /// rows form the j-th contiguous block), S the columns of one shard. `out` is [rows of this
  /// rank, vocab], row-major, with `vocab` <= world_size() * S: shard s lands in columns
  /// [s * S, min((s + 1) * S, vocab)), and columns of the padded vocabulary past `vocab` are
  /// not written. Same dtype (any), no overlap. The same `layout` (equal rows, the CUDA-graph
  /// case, or per-rank counts, a rank may hold none) and shapes on every rank.
  ///
  /// The custom exchange copies each peer's rows straight into their columns: the reassembly
  /// happens in the exchange, with no pass after it. Where it cannot serve (world size 1 or
  /// above 8, no custom kernels, an input larger than the exchange's staging, or
  /// `Options::lm_head_a2a` off), an all-gather of the shards and a local copy of this rank's
  /// rows give the same result; each reason is logged once. Collective, graph-capturable,
  /// bounded waits.
  [[nodiscard]] Status lm_head_exchange(const TensorView& shard_logits, const TensorView& out,
                                        const LmHeadLayout& layout, Stream stream) noexcept;
  /// Sets up what the exchanges need before the engine sizes its memory, so that nothing is
  /// allocated later (during capture above all): the custom exchange's staging grows to hold
  /// `bytes_per_peer` x world_size() bytes per rank's input (4 MiB per peer holds DeepSeek-V3's
  /// LM head at 120 tokens and 8 ranks), and with NCCL in the chain one all-to-all of that size
  /// runs on `stream` (and is waited for) so that NCCL builds its peer-to-peer buffers now. Where
  /// the LM head takes the all-gather + copy path for every call (no custom exchange, or
  /// `Options::lm_head_a2a` off), its temporary of world_size() x that is allocated now too.
  /// Collective; not graph-safe. Throws `Error` when a rank cannot allocate (every rank alike)
  /// or the warm-up fails. Call it before capturing graphs that use the exchanges.
  void prepare_exchange(std::int64_t bytes_per_peer = std::int64_t{4} << 20,
                        Stream stream = nullptr);
  /// out = root's `in` on every rank (`in` is only read on the root; may be empty elsewhere).
  [[nodiscard]] Status broadcast(const TensorView& in, const TensorView& out, int root,
                                 Stream stream) noexcept;
  /// The decode step's all-reduce, residual add and RMSNorm in one call, in one kernel where it
  /// can: `residual_out = sum over ranks(x) + residual`, then `norm_out = residual_out *
  /// rsqrt(mean(residual_out^2) + eps) * gamma` (or `1 + gamma`, with `weight`) per row of the
  /// last dimension (`hidden`). The arguments are those of `add_rmsnorm` (tpcomm/norm.hpp): one
  /// shape for `x`, `residual` and the outputs, `residual` empty for none (`residual_out` is then
  /// the sum), `gamma` of `hidden` elements of the input's dtype or f32, in place as engines
  /// call it (`residual_out == residual`, `norm_out == x`), `norm_out` in f8e4m3 with `fp8`
  /// giving its per-tensor, per-row or per-group scales. `residual` must be the same on every
  /// rank (as under tensor parallelism, where it is replicated).
  /// Accumulation and the mean of squares in fp32; every rank's outputs are bitwise identical.
  ///
  /// Served by a Lamport kernel with the norm as its epilogue (f16/bf16, world size 2..8, within
  /// the fusion workspace: `backend_for_add_rmsnorm` says which); otherwise, with the same
  /// result, by the group's all-reduce followed by the local `add_rmsnorm`, each reason logged
  /// once. The path is decided from rank-invariant facts only. `x` is written only when it is
  /// `norm_out`.
  [[nodiscard]] Status all_reduce_add_rmsnorm(const TensorView& x, const TensorView& residual,
                                              const TensorView& gamma, float eps,
                                              const TensorView& norm_out,
                                              const TensorView& residual_out, Stream stream,
                                              const Fp8Scales& fp8 = {},
                                              NormWeight weight = NormWeight::kGamma) noexcept;
  /// The end of a tensor-parallel MoE layer in one call: `x = moe_combine(moe)` (tpcomm/moe.hpp),
  /// then `all_reduce_add_rmsnorm(x, residual, gamma, eps, norm_out, residual_out, ...)` with its
  /// arguments and rules. Where a Lamport kernel serves the fused norm without FP8 (16-bit, within
  /// the fusion workspace), the combine is that kernel's prologue: each rank combines its packs
  /// as it pushes them, and x is never stored. Elsewhere the combine is a kernel of its own,
  /// writing into `norm_out` where that has the experts' dtype and overlaps no input (else into a
  /// stream-ordered temporary, which graphs capture), and the all-reduce + norm is served as
  /// `all_reduce_add_rmsnorm` is. Both give bitwise the same results. Every rank passes the same
  /// shapes; `experts` and `shared` are this rank's partial outputs.
  [[nodiscard]] Status moe_finalize_all_reduce_add_rmsnorm(
      const MoeCombine& moe, const TensorView& residual, const TensorView& gamma, float eps,
      const TensorView& norm_out, const TensorView& residual_out, Stream stream,
      const Fp8Scales& fp8 = {}, NormWeight weight = NormWeight::kGamma) noexcept;
  /// The sequence-parallel form of `all_reduce_add_rmsnorm` (what vLLM's sequence parallelism
  /// makes of an all-reduce followed by RMSNorm): `x` [tokens, hidden] is summed over the ranks
  /// and each rank keeps its share of the rows, rank r rows [r * tokens / world, (r + 1) * tokens
  /// / world); then on those rows `residual_out = sum + residual` and `norm_out =
  /// RMSNorm(residual_out) * gamma`, with `all_reduce_add_rmsnorm`'s arguments and rules
  /// (`residual`, `norm_out` and `residual_out` are [tokens / world, hidden]: this rank's rows).
  /// `tokens` must be a multiple of the world size, and no output may overlap `x`. Served by the
  /// Lamport two-shot kernel, each rank finishing its own rows, where they start on a 16-byte
  /// boundary of `x` within the fusion bounds (`backend_for_reduce_scatter_add_rmsnorm` says
  /// which); otherwise, with the same result, by the group's reduce-scatter followed by the local
  /// `add_rmsnorm`.
  [[nodiscard]] Status reduce_scatter_add_rmsnorm(const TensorView& x, const TensorView& residual,
                                                  const TensorView& gamma, float eps,
                                                  const TensorView& norm_out,
                                                  const TensorView& residual_out, Stream stream,
                                                  const Fp8Scales& fp8 = {},
                                                  NormWeight weight = NormWeight::kGamma) noexcept;
  /// Point to point: pairs with `recv` on `peer`.
  [[nodiscard]] Status send(const TensorView& buf, int peer, Stream stream) noexcept;
  [[nodiscard]] Status recv(const TensorView& buf, int peer, Stream stream) noexcept;

  /// Prepares `stream` for this group's collectives: launches every kernel the group may run
  /// once on it with nothing to do, waits for the stream (and so for every kernel the caller
  /// launched on it before), and meets every rank. Collective. The group's first collective on a
  /// stream, and `capture`, do this by themselves, so every rank must start using a new stream
  /// at the same call; calling it explicitly says where that happens. Later calls for the same
  /// stream return at once. Where ranks share a process (virtual ranks, one thread per GPU),
  /// launch each of your own kernels once on the stream before this, or before the first
  /// collective on it: a kernel's first launch on a stream while a peer waits can hold that
  /// stream until the peer gives up (README, "Ranks that share a process"). Not graph-safe: call
  /// it outside a capture. kTimeout when a peer does not arrive within `TPCOMM_TIMEOUT_MS`.
  [[nodiscard]] Status warm_up(Stream stream) noexcept;

  /// An open capture scope (see `capture`). Closing it is collective.
  class CaptureScope {
   public:
    CaptureScope(CaptureScope&&) noexcept;
    CaptureScope& operator=(CaptureScope&&) = delete;
    CaptureScope(const CaptureScope&) = delete;
    CaptureScope& operator=(const CaptureScope&) = delete;
    /// Closes the scope if `close()` was not called; a failure is logged and makes the group
    /// unusable.
    ~CaptureScope();
    /// Registers the buffers the captured calls use, exchanging them with every rank.
    /// Collective: every rank must have captured the same calls. Call it after
    /// `cudaStreamEndCapture`. Idempotent.
    [[nodiscard]] Status close() noexcept;

   private:
    friend class Group;
    explicit CaptureScope(Group* group) noexcept : group_(group) {}
    Group* group_;
  };

  /// Opens a capture scope for CUDA-graph capture on `stream`: inside it NCCL is enabled and
  /// large custom all-reduces read the caller's buffers in place; `close()` (or the destructor)
  /// registers those buffers with every rank. Open the scope before `cudaStreamBeginCapture`.
  /// Calls on a stream that is not capturing behave as outside the scope. Collective on close,
  /// and on open for a stream the group has not used yet (`warm_up`).
  [[nodiscard]] CaptureScope capture(Stream stream);

  /// The backend that would serve this all-reduce: "local" (world size 1), "custom_ar:<name>"
  /// with the custom algorithm the selector picks (`tpcomm info` lists them), "nccl", or "none".
  /// Pure: enqueues nothing, and makes the same decision the call would.
  [[nodiscard]] std::string backend_for_all_reduce(const TensorView& in, const TensorView& out,
                                                   bool capturing = false) const noexcept;

  /// The path that would serve this `all_reduce_add_rmsnorm`: "custom_ar:<name>" (a fused
  /// kernel), or the all-reduce's backend followed by "+add_rmsnorm" (e.g. "nccl+add_rmsnorm",
  /// "local+add_rmsnorm"), or "none". Pure.
  [[nodiscard]] std::string backend_for_add_rmsnorm(const TensorView& x, const TensorView& norm_out,
                                                    bool capturing = false) const noexcept;

  /// The path that would serve this `reduce_scatter_add_rmsnorm` (`x` [tokens, hidden], the
  /// whole input): "custom_ar:<name>" (a fused kernel whose ranks finish their own rows), or the
  /// reduce-scatter's path followed by "+add_rmsnorm", or "none". Pure.
  [[nodiscard]] std::string backend_for_reduce_scatter_add_rmsnorm(
      const TensorView& x, const TensorView& norm_out, bool capturing = false) const noexcept;

  /// The path that would serve this `moe_finalize_all_reduce_add_rmsnorm` (`x` is the combine's
  /// output, [tokens, hidden] in the experts' dtype): "custom_ar:<name>" (the combine the fused
  /// kernel's prologue), or "moe_combine+" and the path of the fused call after it, or "none".
  /// Pure.
  [[nodiscard]] std::string backend_for_moe_finalize(const TensorView& x,
                                                     const TensorView& norm_out,
                                                     bool capturing = false) const noexcept;

  /// The backend that would serve this `all_gather` / equal-split `all_to_all`:
  /// "custom_ar:<name>" with the exchange algorithm, "local", "nccl" or "none". Pure.
  [[nodiscard]] std::string backend_for_all_gather(const TensorView& in,
                                                   const TensorView& out) const noexcept;
  [[nodiscard]] std::string backend_for_all_to_all(const TensorView& in,
                                                   const TensorView& out) const noexcept;

  /// The path that would serve this `reduce_scatter`: "nccl", "local", the all-reduce's backend
  /// followed by "+slice" (e.g. "custom_ar:lamport+slice"), or "none". Pure.
  [[nodiscard]] std::string backend_for_reduce_scatter(const TensorView& in, const TensorView& out,
                                                       ReduceOp op = ReduceOp::kSum) const noexcept;

  /// The backend that would serve this `gather`, named as by `backend_for_all_gather`. Pure.
  [[nodiscard]] std::string backend_for_gather(const TensorView& in, const TensorView& out,
                                               int root) const noexcept;

  /// The path that would serve this `lm_head_exchange`: "custom_ar:<name>" (the custom
  /// exchange), or "all_gather:<backend>+copy" (the fallback), or "none". Pure.
  [[nodiscard]] std::string backend_for_lm_head_exchange(const TensorView& shard_logits,
                                                         const TensorView& out,
                                                         const LmHeadLayout& layout) const noexcept;

  /// kOk while usable; otherwise the sticky failure.
  [[nodiscard]] Status health() noexcept;
  /// Called by the watchdog when the group fails: the failure and the message `last_error()`
  /// will give. Runs on the watchdog's thread; it may call `abort()` and `health()`-free
  /// functions of other objects, not this group's collectives.
  using FailureHandler = std::function<void(Status, const std::string&)>;
  /// Sets what this group's watchdog does when the group fails (`FailureMode`: raise, teardown,
  /// or callback with `handler`; callback without a handler acts as raise). Overrides
  /// `Options::failure_mode`. Thread-safe.
  void set_failure_mode(FailureMode mode, FailureHandler handler = {});
  /// What went wrong last (an invalid argument, a timeout naming the rank that did not arrive).
  [[nodiscard]] const std::string& last_error() const noexcept;
  /// Makes every waiting kernel of this group give up and every later call return kAborted.
  /// Safe from any thread, while the owning thread waits or calls: the custom kernels give up
  /// at their next poll, and the NCCL communicator is aborted at once (its kernels return; a call
  /// the owning thread is inside lets go). The watchdog does not treat it as a failure (no
  /// teardown, no callback).
  void abort() noexcept;

  /// Measures every custom all-reduce candidate per size bucket (inside CUDA graphs, on a
  /// private stream), takes rank 0's timings as the decision, installs the table on every rank
  /// and, on rank 0, stores it in the tune file. Collective. No-op without the custom backend.
  void tune();
  /// The table in use as the text of its file (what `tpcomm tune` prints), or empty when the
  /// built-in defaults decide.
  [[nodiscard]] std::string tune_table_text() const;
  /// Where `tune` stores this group's table, and where a group like it looks for one
  /// (`TPCOMM_TUNE_FILE`, or the cache directory; README).
  [[nodiscard]] std::string tune_file() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
