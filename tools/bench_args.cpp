// SPDX-License-Identifier: Apache-2.0
#include "tools/bench_args.hpp"

#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "core/parse.hpp"
#include "tools/audit.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm::tools {
namespace {

constexpr std::array<std::pair<kernels::Collective, std::string_view>, 5> kCollNames{{
    {kernels::Collective::kAllReduce, "allreduce"},
    {kernels::Collective::kAllGather, "allgather"},
    {kernels::Collective::kReduceScatter, "reducescatter"},
    {kernels::Collective::kAllToAll, "alltoall"},
    {kernels::Collective::kBroadcast, "broadcast"},
}};

/// A CLI11 validator/transformer for byte sizes with K/M/G suffixes.
CLI::Validator bytes_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto b = parse_bytes(s);
        if (!b) return "not a size: " + s + " (use e.g. 512, 8K, 64M, 1G)";
        s = std::to_string(*b);
        return {};
      },
      "SIZE");
}

/// -f: 0 (step by -i) or a whole factor from 2 to `kMaxBenchStepFactor`. Checked on the text,
/// so that a number out of range is refused rather than clamped on its way in.
CLI::Validator step_factor_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        auto f = parse_int(s);
        if (!f || *f < 0 || *f == 1 || *f > kMaxBenchStepFactor)
          return "the step factor must be a whole number from 2 to " +
                 std::to_string(kMaxBenchStepFactor) + " (or 0: step by -i), not " + s;
        return {};
      },
      "FACTOR");
}

/// -b, -e, -f, -i: the sizes swept.
void add_size_options(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option("-b,--minbytes", o.min_bytes, "smallest size in bytes (K/M/G suffixes)")
      ->transform(bytes_validator());
  cmd.add_option("-e,--maxbytes", o.max_bytes,
                 "largest size in bytes (K/M/G suffixes), at most 64G (2^36)")
      ->transform(bytes_validator());
  auto* f = cmd.add_option("-f,--stepfactor", o.step_factor,
                           "multiply the size by this factor, from 2 to 2^36 (0: add -i)")
                ->check(step_factor_validator());
  auto* i = cmd.add_option("-i,--stepbytes", o.step_bytes,
                           "add this many bytes to the size; a sweep has at most 1024 sizes")
                ->transform(bytes_validator());
  f->excludes(i);
}

/// -n, -w, -c: iterations per size.
void add_iteration_options(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option("-n,--iters", o.iters, "timed iterations per size")->check(CLI::Range(1, 1000000));
  cmd.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations per size")
      ->check(CLI::Range(0, 1000000));
  cmd.add_option("-c,--check", o.check, "checked iterations per size (0: no check)")
      ->check(CLI::Range(0, 1000));
}

/// -d, -o, --op, -r: the collective and its arguments.
void add_collective_options(CLI::App& cmd, BenchOptions& o) {
  // Names map to values through the parsers the rest of tpcomm uses.
  cmd.add_option_function<std::string>(
      "-d,--datatype",
      [&o](const std::string& name) {
        auto t = parse_dtype(name);
        if (!t)
          throw CLI::ValidationError(
              "-d", "unknown type " + name + " (float, half, bfloat16, int32, ...)");
        o.dtype = *t;
      },
      "element type: float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, "
      "f8e4m3, f8e5m2");
  cmd.add_option_function<std::string>(
      "-o,--redop",
      [&o](const std::string& name) {
        auto r = parse_reduce_op(name);
        if (!r)
          throw CLI::ValidationError("-o",
                                     "unknown reduction " + name + " (sum, prod, max, min, avg)");
        o.redop = *r;
      },
      "reduction operator: sum, prod, max, min, avg");
  cmd.add_option_function<std::string>(
      "--op",
      [&o](const std::string& name) {
        o.moe = name == "moe_finalize";
        o.scattered = name == "reducescatter_add_rmsnorm";
        o.add_rmsnorm = name == "allreduce_add_rmsnorm" || o.moe || o.scattered;
        o.lm_head = name == "lm_head_exchange";
        o.gather = name == "gather";
        if (o.gather || o.scattered) {
          o.op = o.gather ? kernels::Collective::kAllGather : kernels::Collective::kReduceScatter;
          return;
        }
        if (o.add_rmsnorm || o.lm_head) {
          o.op = o.lm_head ? kernels::Collective::kAllToAll : kernels::Collective::kAllReduce;
          return;
        }
        for (const auto& [k, n] : kCollNames) {
          if (n == name) {
            o.op = k;
            return;
          }
        }
        throw CLI::ValidationError("--op", "unknown collective " + name);
      },
      "collective: allreduce, allgather, gather (to --root; sizes as allgather's), "
      "reducescatter, alltoall, broadcast, "
      "allreduce_add_rmsnorm (the fused all-reduce + residual add + RMSNorm; sizes are of x, "
      "whole rows of --hidden), moe_finalize (the MoE combine of --top-k expert rows a token, "
      "then the same; sizes are of x), reducescatter_add_rmsnorm (the sequence-parallel form: x "
      "summed over the ranks, each keeping its tokens / world rows, then the add + RMSNorm of "
      "those; sizes are of x, whole rows of --hidden rounded up to a multiple of the world size; "
      "bus bandwidth as the reduce-scatter's), lm_head_exchange (the vocabulary-sharded LM head's "
      "exchange of --vocab columns, swept over --tokens rows per rank; sizes are of each rank's "
      "output)");
  cmd.add_option("--hidden", o.hidden,
                 "row length of allreduce_add_rmsnorm, moe_finalize and "
                 "reducescatter_add_rmsnorm, in elements")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd.add_option("--top-k", o.top_k, "expert rows a token of moe_finalize combines")
      ->capture_default_str()
      ->check(CLI::Range(1, kernels::kMoeMaxTopK));
  cmd.add_flag("--shared-expert", o.shared_expert, "moe_finalize adds a shared expert's output");
  cmd.add_option("--vocab", o.vocab, "vocabulary of lm_head_exchange (columns of the output)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  cmd.add_option("--tokens", o.tokens, "rows per rank of lm_head_exchange, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  cmd.add_option("-r,--root", o.root, "root of broadcast")->check(CLI::Range(0, 1023));
}

/// -G, --graph-replays, -u: how the iterations run.
void add_execution_options(CLI::App& cmd, BenchOptions& o) {
  cmd.add_flag("-G,--graph", o.graph,
               "capture the iterations in a CUDA graph and time its replays");
  cmd.add_option("--graph-replays", o.graph_replays,
                 "replays of the captured graph (median reported)")
      ->check(CLI::Range(1, 100000));
  cmd.add_option("-u,--unalign", o.unalign, "offset both buffers by this many elements")
      ->check(CLI::Range(0, 1024));
  cmd.add_flag("--cold", o.cold,
               "evict the L2 cache before each timed operation (write a buffer twice its size) "
               "and time the operations alone, as a decode step's calls find the cache");
  cmd.add_flag("--audit", o.audit,
               "time every path the group can take (--algo all less nccl_direct, memcpy, the "
               "plain all-reduce and reducescatter_add_rmsnorm's all-reduce form), --audit-repeats "
               "times alternating, and report each size where the built-in choice (auto) is "
               "slower than the fastest by more than 3% and 0.2 us");
  cmd.add_option("--audit-repeats", o.audit_repeats, "rounds of --audit over every path")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd.add_flag("-q,--quiet", o.quiet, "no progress lines (they go to a terminal's stderr only)");
}

/// --algo: the ways of serving the collective to compare.
void add_algo_option(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option_function<std::vector<std::string>>(
         "--algo",
         [&o](const std::vector<std::string>& names) {
           o.algos.clear();
           for (const std::string& n : names) {
             if (n == "all") {
               for (const BenchAlgo& a : all_bench_algos(o)) o.algos.push_back(a);
               continue;
             }
             auto a = parse_bench_algo(n);
             if (!a)
               throw CLI::ValidationError("--algo", "unknown algorithm " + n + " (" +
                                                        pinned_names() + ", " + exchange_names() +
                                                        ", unfused, allreduce, prologue, "
                                                        "combine_first, allreduce_add_rmsnorm, "
                                                        "all_gather, nccl_direct, memcpy, all)");
             o.algos.push_back(*a);
           }
         },
         "how to serve the collective, comma-separated: " + pinned_names() +
             " (a custom algorithm is pinned where it can serve; elsewhere the built-in choice), " +
             exchange_names() +
             " (the custom exchange of allgather, alltoall and lm_head_exchange), "
             "nccl_direct, memcpy (a device copy of the same bytes, for reference), unfused and "
             "allreduce (with --op allreduce_add_rmsnorm: the all-reduce then add_rmsnorm, and the "
             "all-reduce alone; with --op moe_finalize: the combine, the all-reduce, then "
             "add_rmsnorm, and the all-reduce alone), prologue and combine_first (with --op "
             "moe_finalize: the combine inside the fused kernel, or launched before it), unfused "
             "and allreduce_add_rmsnorm (with --op reducescatter_add_rmsnorm: the reduce-scatter "
             "then add_rmsnorm of this rank's rows, and the fused all-reduce + norm of every row), "
             "all_gather (with --op lm_head_exchange: an "
             "all-gather of the "
             "shards, then a copy of the local rows), all (give --op first)")
      ->delimiter(',');
}

/// --json, -g, --virtual-ranks, --timeout, --seed: output, processes and test data.
void add_run_options(CLI::App& cmd, BenchOptions& o) {
  cmd.add_option("--json", o.json, "also write the results as JSON to this file");
  auto* g = cmd.add_option("-g,--ngpus", o.gpus, "start this many processes, one per GPU")
                ->check(CLI::Range(1, 64));
  auto* v =
      cmd.add_option("--virtual-ranks", o.virtual_ranks, "run this many ranks as threads on GPU 0")
          ->check(CLI::Range(1, 8));
  g->excludes(v);
  cmd.add_option("--timeout", o.timeout_s, "seconds before a self-launched run is stopped")
      ->check(CLI::Range(1, 86400));
  cmd.add_option("--seed", o.seed, "seed of the test data (0: random)");
}

/// How many sizes the sweep of `o` has, counting no further than `kMaxBenchSizes + 1`. Needs
/// 0 < min_bytes <= max_bytes <= kMaxBenchBytes and a valid step.
std::int64_t sweep_length(const BenchOptions& o) {
  if (o.step_factor < 2) return (o.max_bytes - o.min_bytes) / o.step_bytes + 1;
  std::int64_t n = 1;
  for (std::int64_t s = o.min_bytes; s <= o.max_bytes / o.step_factor; s *= o.step_factor) ++n;
  return n;
}

// NOTE [one callback per command]
// For a subcommand, CLI11's `callback` and `final_callback` set the same slot (CLI11 2.x): the
// last call wins. The checks below are that callback, so the command's body is scheduled from
// inside it (`on_valid`), after the checks passed, and nowhere else.

/// The checks that involve several options, run after parsing; then `on_valid`.
void add_sweep_checks(CLI::App& cmd, BenchOptions& o, std::function<void()> on_valid) {
  cmd.callback([&o, on_valid = std::move(on_valid)] {
    if (o.min_bytes <= 0 || o.max_bytes < o.min_bytes)
      throw CLI::ValidationError("-b/-e", "need 0 < minbytes <= maxbytes");
    if (o.max_bytes > kMaxBenchBytes)
      throw CLI::ValidationError(
          "-e", "the largest size is at most " + std::to_string(kMaxBenchBytes) + " bytes (64G)");
    if (o.step_factor == 1) throw CLI::ValidationError("-f", "a step factor of 1 never ends");
    if (o.step_factor == 0 && o.step_bytes <= 0)
      throw CLI::ValidationError("-i", "the step must be positive");
    // The fused operations sum rows of floating point (tpcomm/group.hpp).
    if (o.add_rmsnorm && o.redop != ReduceOp::kSum)
      throw CLI::ValidationError("-o", "--op " + bench_op_name(o) + " sums; it takes no -o " +
                                           std::string(to_string(o.redop)));
    if (o.add_rmsnorm && o.dtype != DType::kF16 && o.dtype != DType::kBF16 &&
        o.dtype != DType::kF32)
      throw CLI::ValidationError("-d", "--op " + bench_op_name(o) +
                                           " takes float, half or bfloat16, not " +
                                           std::string(to_string(o.dtype)));
    if (o.audit) {
      o.algos.clear();
      for (const BenchAlgo& a : all_bench_algos(o))
        if (audited_algo(a.name)) o.algos.push_back(a);
    }
    if (sweep_length(o) > kMaxBenchSizes)
      throw CLI::ValidationError("-b/-e/-i", "the sweep would have more than " +
                                                 std::to_string(kMaxBenchSizes) +
                                                 " sizes; use a larger -i or a -f");
    if (on_valid) on_valid();
  });
}

}  // namespace

bool exchange_op(const BenchOptions& o) noexcept {
  return o.lm_head || (!o.add_rmsnorm && (o.op == kernels::Collective::kAllGather ||
                                          o.op == kernels::Collective::kAllToAll));
}

std::string bench_op_name(const BenchOptions& o) {
  if (o.lm_head) return "lm_head_exchange";
  if (o.gather) return "gather";
  if (o.moe) return "moe_finalize";
  if (o.scattered) return "reducescatter_add_rmsnorm";
  return o.add_rmsnorm ? "allreduce_add_rmsnorm" : std::string(collective_name(o.op));
}

std::string row_refusal(const BenchOptions& o, const BenchAlgo& algo) {
  using Kind = BenchAlgo::Kind;
  const Kind k = algo.kind;
  if ((k == Kind::kUnfused && !o.add_rmsnorm) ||
      (k == Kind::kAllReduceOnly && (!o.add_rmsnorm || o.scattered)))
    return "a row of --op allreduce_add_rmsnorm";
  if (o.add_rmsnorm && (k == Kind::kMemcpy || k == Kind::kNcclDirect))
    return "not a way to run " + bench_op_name(o);
  if (k == Kind::kExchange && !exchange_op(o))
    return "the exchange serves allgather, alltoall and lm_head_exchange";
  if (k == Kind::kLmHeadAllGather && !o.lm_head) return "a row of --op lm_head_exchange";
  if (o.lm_head && k == Kind::kNcclDirect) return "NCCL has no LM-head exchange";
  if (o.gather && k == Kind::kNcclDirect) return "NCCL has no gather";
  if (k == Kind::kMoeForm && !o.moe) return "a row of --op moe_finalize";
  if (k == Kind::kUnscattered && !o.scattered) return "a row of --op reducescatter_add_rmsnorm";
  if (algo.pins_custom() && o.op != kernels::Collective::kAllReduce)
    return o.scattered ? "no custom kernel serves a scattered sum"
                       : "the custom kernels serve all-reduce only";
  return {};
}

std::vector<BenchAlgo> all_bench_algos(const BenchOptions& o) {
  std::vector<BenchAlgo> out{BenchAlgo{}};
  if (exchange_op(o)) {
    for (const ExchangeInfo& e : kExchangeAlgorithms)
      out.push_back({BenchAlgo::Kind::kExchange, std::string(e.name)});
    if (o.lm_head) out.push_back({BenchAlgo::Kind::kLmHeadAllGather, "all_gather"});
    out.push_back({BenchAlgo::Kind::kGroup, "nccl"});
    if (!o.lm_head && !o.gather) out.push_back({BenchAlgo::Kind::kNcclDirect, "nccl_direct"});
    out.push_back({BenchAlgo::Kind::kMemcpy, "memcpy"});
    return out;
  }
  if (o.scattered) {
    // No custom kernel serves a scattered sum: the algorithms that fuse would pin nothing.
    out.push_back({BenchAlgo::Kind::kUnfused, "unfused"});
    out.push_back({BenchAlgo::Kind::kUnscattered, "allreduce_add_rmsnorm"});
    return out;
  }
  if (o.op != kernels::Collective::kAllReduce) {
    out.push_back({BenchAlgo::Kind::kGroup, "nccl"});
    out.push_back({BenchAlgo::Kind::kNcclDirect, "nccl_direct"});
    out.push_back({BenchAlgo::Kind::kMemcpy, "memcpy"});
    return out;
  }
  if (o.add_rmsnorm) {
    if (o.moe) {
      out.push_back({BenchAlgo::Kind::kMoeForm, "prologue"});
      out.push_back({BenchAlgo::Kind::kMoeForm, "combine_first"});
    }
    for (const AlgoInfo& a : kAlgorithms)
      if (kernels::fuses(a.kernel)) out.push_back({BenchAlgo::Kind::kGroup, std::string(a.name)});
    out.push_back({BenchAlgo::Kind::kUnfused, "unfused"});
    out.push_back({BenchAlgo::Kind::kAllReduceOnly, "allreduce"});
    return out;
  }
  for (const AlgoInfo& a : kAlgorithms)
    out.push_back({BenchAlgo::Kind::kGroup, std::string(a.name)});
  out.push_back({BenchAlgo::Kind::kGroup, "nccl"});
  out.push_back({BenchAlgo::Kind::kNcclDirect, "nccl_direct"});
  out.push_back({BenchAlgo::Kind::kMemcpy, "memcpy"});
  return out;
}

std::optional<BenchAlgo> parse_bench_algo(std::string_view name) {
  if (name == "nccl_direct" || name == "nccl-direct")
    return BenchAlgo{BenchAlgo::Kind::kNcclDirect, "nccl_direct"};
  if (name == "memcpy") return BenchAlgo{BenchAlgo::Kind::kMemcpy, "memcpy"};
  if (name == "unfused") return BenchAlgo{BenchAlgo::Kind::kUnfused, "unfused"};
  if (name == "allreduce") return BenchAlgo{BenchAlgo::Kind::kAllReduceOnly, "allreduce"};
  if (name == "allreduce_add_rmsnorm")
    return BenchAlgo{BenchAlgo::Kind::kUnscattered, "allreduce_add_rmsnorm"};
  if (name == "prologue" || name == "combine_first" || name == "combine-first")
    return BenchAlgo{BenchAlgo::Kind::kMoeForm, name == "prologue" ? "prologue" : "combine_first"};
  if (name == "all_gather" || name == "all-gather")
    return BenchAlgo{BenchAlgo::Kind::kLmHeadAllGather, "all_gather"};
  for (const ExchangeInfo& e : kExchangeAlgorithms)
    if (name == e.name) return BenchAlgo{BenchAlgo::Kind::kExchange, std::string(e.name)};
  Pinned pinned;
  if (!parse_pinned(name, &pinned)) return std::nullopt;
  return BenchAlgo{BenchAlgo::Kind::kGroup, std::string(to_string(pinned))};
}

std::string_view collective_name(kernels::Collective op) noexcept {
  for (const auto& [k, n] : kCollNames)
    if (k == op) return n;
  return "unknown";
}

void add_bench_options(CLI::App& cmd, BenchOptions& o, std::function<void()> on_valid) {
  // In this order, which is the order of the help text.
  add_size_options(cmd, o);
  add_iteration_options(cmd, o);
  add_collective_options(cmd, o);
  add_execution_options(cmd, o);
  add_algo_option(cmd, o);
  add_run_options(cmd, o);
  add_sweep_checks(cmd, o, std::move(on_valid));
}

std::int64_t fused_count(std::int64_t bytes, DType dtype, std::int64_t hidden) noexcept {
  const std::int64_t rows = bytes / static_cast<std::int64_t>(dtype_size(dtype)) / hidden;
  return std::max<std::int64_t>(rows, 1) * hidden;
}

std::int64_t fused_count(const BenchOptions& o, std::int64_t bytes, int world) noexcept {
  const std::int64_t rows = fused_count(bytes, o.dtype, o.hidden) / o.hidden;
  const std::int64_t multiple = o.scattered ? std::max(world, 1) : 1;
  return (rows + multiple - 1) / multiple * multiple * o.hidden;
}

std::vector<std::int64_t> bench_sizes(const BenchOptions& o) {
  std::vector<std::int64_t> out;
  for (std::int64_t s = o.min_bytes; s > 0 && s <= o.max_bytes;) {
    out.push_back(s);
    if (std::ssize(out) >= kMaxBenchSizes) break;
    // Compared before stepping, so that no step can overflow.
    if (o.step_factor > 1) {
      if (s > o.max_bytes / o.step_factor) break;
      s *= o.step_factor;
    } else {
      if (o.step_bytes <= 0 || s > o.max_bytes - o.step_bytes) break;
      s += o.step_bytes;
    }
  }
  return out;
}

double bus_factor(kernels::Collective op, int world_size) noexcept {
  const double n = world_size;
  switch (op) {
    case kernels::Collective::kAllReduce:
      return 2.0 * (n - 1) / n;
    case kernels::Collective::kAllGather:
    case kernels::Collective::kReduceScatter:
    case kernels::Collective::kAllToAll:
      return (n - 1) / n;
    case kernels::Collective::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

std::int64_t bench_count(kernels::Collective op, std::int64_t bytes, DType dtype,
                         int world_size) noexcept {
  const auto es = static_cast<std::int64_t>(dtype_size(dtype));
  std::int64_t count = bytes / es;
  switch (op) {
    case kernels::Collective::kAllGather:
    case kernels::Collective::kReduceScatter:
    case kernels::Collective::kAllToAll:
      count -= count % world_size;
      break;
    case kernels::Collective::kAllReduce:
    case kernels::Collective::kBroadcast:
      break;
  }
  return count;
}

}  // namespace tpcomm::tools
