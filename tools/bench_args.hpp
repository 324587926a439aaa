// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench`: its options (nccl-tests' flags) and the arithmetic of its report.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::tools {

/// How a benchmark row serves the collective.
struct BenchAlgo {
  enum class Kind : std::uint8_t {
    /// Through a `Group` whose `Options::algo` is `name`: "auto" (the group decides), "nccl"
    /// (its NCCL backend) or a custom algorithm of the registry (pinned).
    kGroup,
    /// ncclAllReduce & co. called directly on an NCCL communicator: the peer.
    kNcclDirect,
    /// A device-to-device copy of the same bytes: the one-GPU physical limit.
    kMemcpy,
    /// With `--op allreduce_add_rmsnorm`: the group's all-reduce followed by `add_rmsnorm`, the
    /// unfused pair the fused operation replaces (with `--op reducescatter_add_rmsnorm`: the
    /// group's reduce-scatter, then `add_rmsnorm` of this rank's rows).
    kUnfused,
    /// With `--op allreduce_add_rmsnorm`: the group's plain all-reduce of the same bytes.
    kAllReduceOnly,
    /// With `--op allgather`, `alltoall` or `lm_head_exchange`: a group whose custom exchange
    /// algorithm `name` serves (the row fails where it cannot).
    kExchange,
    /// With `--op lm_head_exchange`: SGLang's path before the all-to-all, an all-gather of the
    /// shards (tpcomm's own) and a separate copy of the local rows into place.
    kLmHeadAllGather,
    /// With `--op moe_finalize`: a group whose `Options::moe_prologue` is on ("prologue": the
    /// combine inside the fused kernel) or off ("combine_first": the combine kernel, then the
    /// fused call).
    kMoeForm,
    /// With `--op reducescatter_add_rmsnorm`: `all_reduce_add_rmsnorm` of every row, what an
    /// engine without sequence parallelism calls in its place.
    kUnscattered,
  };
  Kind kind = Kind::kGroup;
  /// The row's name, as `--algo` spells it canonically.
  std::string name = "auto";

  /// True for a group row pinned to one custom all-reduce algorithm.
  [[nodiscard]] bool pins_custom() const noexcept {
    return kind == Kind::kGroup && name != "auto" && name != "nccl";
  }
  friend bool operator==(const BenchAlgo&, const BenchAlgo&) = default;
};

/// The largest `-e` (and so `-b`) the sweep accepts, in bytes per rank's buffer: 64 GiB, more
/// than one GPU holds, so that no size computation can come near 64-bit overflow.
inline constexpr std::int64_t kMaxBenchBytes = std::int64_t{1} << 36;
/// The most sizes one sweep may have (`-b`, `-e` and `-f` or `-i` together).
inline constexpr std::int64_t kMaxBenchSizes = 1024;
/// The largest `-f`: any factor larger than `kMaxBenchBytes` gives a sweep of one size anyway.
inline constexpr std::int64_t kMaxBenchStepFactor = kMaxBenchBytes;

/// A `--algo` name (any case, '-' for '_', the registry's aliases), or nullopt.
std::optional<BenchAlgo> parse_bench_algo(std::string_view name);

struct BenchOptions {
  std::int64_t min_bytes = 32 << 20;  // -b
  std::int64_t max_bytes = 32 << 20;  // -e
  std::int64_t step_factor = 0;       // -f (multiplicative; 0 = use step_bytes)
  std::int64_t step_bytes = 1 << 20;  // -i (additive)
  int iters = 20;                     // -n
  int warmup = 5;                     // -w
  int check = 1;                      // -c: checked iterations per size (0 = no check)
  DType dtype = DType::kF32;          // -d
  ReduceOp redop = ReduceOp::kSum;    // -o
  kernels::Collective op = kernels::Collective::kAllReduce;  // --op
  /// --op allreduce_add_rmsnorm: the fused all-reduce + residual add + RMSNorm over rows of
  /// `hidden` elements (`op` stays kAllReduce: residual_out is checked as the all-reduce).
  bool add_rmsnorm = false;
  std::int64_t hidden = 4096;  // --hidden
  /// --op moe_finalize: the MoE combine of `top_k` expert rows a token (plus a shared expert's
  /// output with `shared_expert`) before the fused operation (`add_rmsnorm` is set too: the same
  /// sizes, outputs and checks; the combine's weights make x the input).
  bool moe = false;
  int top_k = 8;               // --top-k
  bool shared_expert = false;  // --shared-expert
  /// --op reducescatter_add_rmsnorm: the sequence-parallel form, `reduce_scatter_add_rmsnorm`
  /// (`add_rmsnorm` is set too; `op` is kReduceScatter: its bus factor, and residual_out is
  /// checked as this rank's slice of the reduce-scatter). x's rows are rounded up to a multiple
  /// of the world size (`fused_count`).
  bool scattered = false;
  /// --op lm_head_exchange: the vocabulary-sharded LM head's exchange of `vocab` columns
  /// (`op` is kAllToAll, for the bus factor), swept over `tokens` rows per rank instead of sizes.
  bool lm_head = false;
  /// --op gather: every rank's input to rank `root` (`op` is kAllGather: the all-gather's sizes
  /// and data, checked on the root).
  bool gather = false;
  std::int64_t vocab = 129280;                   // --vocab
  std::vector<std::int64_t> tokens{1, 36, 120};  // --tokens
  int root = 0;                                  // -r
  bool graph = false;                            // --graph
  int graph_replays = 10;                        // --graph-replays
  std::int64_t unalign = 0;                      // -u (elements)
  std::vector<BenchAlgo> algos{BenchAlgo{}};     // --algo
  /// --cold: the L2 cache is evicted before each timed operation (a buffer larger than it is
  /// written), and only the operations are timed, as a decode step's calls find the cache.
  bool cold = false;
  /// --audit: every path the group can take (`all_bench_algos` less the peers), `audit_repeats`
  /// times alternating, then where the built-in choice is slower than the fastest
  /// (tools/audit.hpp).
  bool audit = false;
  int audit_repeats = 3;   // --audit-repeats
  bool quiet = false;      // --quiet: no progress lines on a terminal
  std::string json;        // --json FILE
  int gpus = 0;            // -g N: launch N processes, one per GPU
  int virtual_ranks = 0;   // --virtual-ranks N: N threads on GPU 0
  int timeout_s = 600;     // deadline of a self-launched run
  std::uint64_t seed = 0;  // --seed (0 = random)
};

/// Every row `--algo all` runs for the collective `o` describes: for all-reduce auto, the
/// registry's all-reduce algorithms, nccl, nccl_direct, memcpy; for allreduce_add_rmsnorm auto,
/// the algorithms that fuse, unfused and allreduce; for reducescatter_add_rmsnorm auto, unfused
/// and allreduce_add_rmsnorm (no custom kernel serves a scattered sum); for allgather and alltoall
/// auto, the exchange algorithms, nccl, nccl_direct, memcpy; for lm_head_exchange auto, the
/// exchange algorithms, all_gather, nccl and memcpy; for moe_finalize auto, prologue,
/// combine_first, the algorithms that fuse (each with the prologue), unfused and allreduce; for the
/// others auto, nccl, nccl_direct, memcpy.
std::vector<BenchAlgo> all_bench_algos(const BenchOptions& o);

/// True for the collectives the custom exchange serves (all-gather, all-to-all, the LM head's).
[[nodiscard]] bool exchange_op(const BenchOptions& o) noexcept;

/// Empty where the row `algo` is a way to run the collective `o` describes; else why not (the
/// bench skips the row with that line).
[[nodiscard]] std::string row_refusal(const BenchOptions& o, const BenchAlgo& algo);

/// The `--op` name of the collective `o` describes ("allreduce", "moe_finalize", ...).
[[nodiscard]] std::string bench_op_name(const BenchOptions& o);

/// Adds the options to `cmd` (the `bench` subcommand) and validates them after parsing. The
/// checks that involve several options run in `cmd`'s callback, which then calls `on_valid`
/// (when given): the command's body must be scheduled there, never through another
/// `callback` or `final_callback` of `cmd`, which would replace the checks (NOTE [one callback
/// per command]).
void add_bench_options(CLI::App& cmd, BenchOptions& o, std::function<void()> on_valid = {});

/// The sizes of the sweep, in bytes, as nccl-tests steps them (-f multiplies, else -i adds); at
/// most `kMaxBenchSizes`, none above `o.max_bytes`, and no step overflows.
std::vector<std::int64_t> bench_sizes(const BenchOptions& o);

/// nccl-tests' bus-bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
/// reduce-scatter and all-to-all, 1 for broadcast.
double bus_factor(kernels::Collective op, int world_size) noexcept;

/// Elements of the buffer whose size nccl-tests reports (the per-rank all-reduce buffer, the
/// gathered/scattered total, the all-to-all total), rounded down to whole elements that split
/// evenly over the ranks where the collective needs that.
std::int64_t bench_count(kernels::Collective op, std::int64_t bytes, DType dtype,
                         int world_size) noexcept;

/// "allreduce", "allgather", ...
std::string_view collective_name(kernels::Collective op) noexcept;

/// Elements of one fused operation for a sweep size of `bytes`: whole rows of `hidden`, at least
/// one.
std::int64_t fused_count(std::int64_t bytes, DType dtype, std::int64_t hidden) noexcept;

/// Elements of x of one fused operation of `o` for a sweep size of `bytes` at `world` ranks:
/// `fused_count`, its rows rounded up to a multiple of `world` for reducescatter_add_rmsnorm
/// (whose tokens split evenly over the ranks).
std::int64_t fused_count(const BenchOptions& o, std::int64_t bytes, int world) noexcept;

}  // namespace tpcomm::tools
