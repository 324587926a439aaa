// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench`: an nccl-tests-style sweep over every way tpcomm can serve a collective.
#include <cuda_runtime.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "backends/nccl_comm.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "tools/bench_args.hpp"
#include "tools/bench_report.hpp"
#include "tools/bench_runner.hpp"
#include "tools/cold_timer.hpp"
#include "tools/commands.hpp"
#include "tools/json_file.hpp"
#include "tools/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/norm.hpp"
#include "tune/graph_timer.hpp"

namespace tpcomm::tools {
namespace {

using kernels::Collective;

/// One measured column (out-of-place or in-place).
struct Measure {
  bool ran = false;
  double time_us = 0;
  std::uint64_t wrong = 0;
  std::string failure;
};

/// Per-rank device buffers of the largest size, plus the error counter: host-mapped, so that
/// reading it needs no copy (NOTE [graphs of virtual ranks]).
struct Buffers {
  void* in = nullptr;
  void* out = nullptr;
  unsigned long long* wrong_host = nullptr;
  unsigned long long* wrong = nullptr;  // the device's view of `wrong_host`
  std::int64_t in_bytes = 0;
  std::int64_t out_bytes = 0;
  ~Buffers() {
    cudaFree(in);
    cudaFree(out);
    cudaFreeHost(wrong_host);
  }
  unsigned long long read_wrong() const {
    return *static_cast<volatile unsigned long long*>(wrong_host);
  }
};

class Bench {
 public:
  Bench(Bootstrap& boot, int device, const BenchOptions& o, std::uint64_t seed)
      : boot_(boot), device_(device), o_(o), seed_(seed) {}

  /// Runs every row; returns the number of wrong elements seen (summed over ranks), or -1
  /// after a failure. Rank 0 prints.
  std::int64_t run(nlohmann::json& rows) {
    DeviceGuard guard(device_);
    allocate();
    std::int64_t total_wrong = 0;
    bool failed = false;
    // --audit: the rounds alternate over the paths, so that drift falls on every path alike.
    const int rounds = o_.audit ? o_.audit_repeats : 1;
    for (round_ = 0; round_ < rounds && !failed; ++round_) {
      for (const BenchAlgo& algo : o_.algos) {
        if (!runs_here(algo)) continue;
        std::optional<Runner> runner;
        std::string why;
        try {
          runner.emplace(boot_, device_, o_, algo, max_input_bytes_);
        } catch (const Error& e) {
          why = e.what();
        }
        if (!runner) {
          if (boot_.rank() == 0)
            std::printf("#\n# %s: skipped: %s\n", algo.name.c_str(), why.c_str());
          continue;
        }
        if (runner->warm_up(stream()) != Status::kOk) {
          if (boot_.rank() == 0)
            std::printf("#\n# %s: failed: %s\n", algo.name.c_str(), runner->last_error().c_str());
          failed = true;
          break;
        }
        failed = !sweep(*runner, algo, rows, total_wrong);
        if (failed) break;
      }
    }
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
    return failed ? -1 : total_wrong;
  }

 private:
  /// The stream, events and per-rank buffers of the largest size, and the error counter.
  void allocate() {
    TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    graph_ = std::make_unique<GraphTimer>(stream());
    TPCOMM_CUDA_CHECK(cudaEventCreate(&start_));
    TPCOMM_CUDA_CHECK(cudaEventCreate(&stop_));
    const auto es = static_cast<std::int64_t>(dtype_size(o_.dtype));
    Shape max_shape{0, 0};
    for (std::size_t k = 0; k < sweep_size(); ++k) {
      const Shape sh = shape_at(k);
      max_shape = {std::max(max_shape.in, sh.in), std::max(max_shape.out, sh.out)};
    }
    max_input_bytes_ = max_shape.in * es;
    // In-place all-gather/reduce-scatter work inside the larger buffer, so size both alike.
    const std::int64_t elems = std::max(max_shape.in, max_shape.out) + o_.unalign + 64;
    bufs_.in_bytes = elems * es;
    bufs_.out_bytes = elems * es;
    TPCOMM_CUDA_CHECK(cudaMalloc(&bufs_.in, static_cast<std::size_t>(bufs_.in_bytes)));
    TPCOMM_CUDA_CHECK(cudaMalloc(&bufs_.out, static_cast<std::size_t>(bufs_.out_bytes)));
    // The MoE combine reads expert rows past the sweep's current size with weight 0: never NaN.
    TPCOMM_CUDA_CHECK(cudaMemset(bufs_.in, 0, static_cast<std::size_t>(bufs_.in_bytes)));
    if (o_.cold)
      cold_ = std::make_unique<ColdTimer>(
          stream(), device_, ranks_share_gpu(boot_, device_) ? boot_.world_size() : 1, o_.iters);
    TPCOMM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&bufs_.wrong_host),
                                    sizeof(unsigned long long), cudaHostAllocMapped));
    TPCOMM_CUDA_CHECK(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&bufs_.wrong), bufs_.wrong_host, 0));
  }

  /// Rank 0 in the first round: the lines that would repeat each round.
  bool first_report() const { return boot_.rank() == 0 && round_ == 0; }

  /// False, with a line saying why, for a row this run cannot serve.
  bool runs_here(const BenchAlgo& algo) {
    const bool nccl_path = algo.kind == BenchAlgo::Kind::kNcclDirect ||
                           (algo.kind == BenchAlgo::Kind::kGroup && algo.name == "nccl");
    if (nccl_path && boot_.world_size() > 1 && ranks_share_gpu(boot_, device_)) {
      if (first_report())
        std::printf(
            "#\n# %s: skipped: NCCL refuses two ranks on one GPU (run with -g on several GPUs)\n",
            algo.name.c_str());
      return false;
    }
    if (const std::string why = row_refusal(o_, algo); !why.empty()) {
      if (first_report()) std::printf("#\n# %s: skipped: %s\n", algo.name.c_str(), why.c_str());
      return false;
    }
    return true;
  }

  /// One row: every size, out of place and in place; rank 0 prints and records. False after a
  /// failure.
  bool sweep(Runner& runner, const BenchAlgo& algo, nlohmann::json& rows,
             std::int64_t& total_wrong) {
    const auto es = static_cast<std::int64_t>(dtype_size(o_.dtype));
    print_header(algo);
    const std::size_t sizes = sweep_size();
    for (std::size_t k = 0; k < sizes; ++k) {
      const Shape s = shape_at(k);
      // The reported count: of the output for the LM head, of x for the fused operations (the
      // MoE finalize's input is its expert rows), of the larger buffer otherwise.
      const std::int64_t count = o_.lm_head || o_.moe ? s.out : std::max(s.in, s.out);
      const std::int64_t bytes = count * es;
      // A form of the exchange that does not serve this size (the push form's Lamport slots
      // hold small messages only) is not timed: its row says which path would serve it.
      if (algo.kind == BenchAlgo::Kind::kExchange &&
          runner.served_by(s).rfind("custom_ar:" + algo.name, 0) != 0) {
        if (boot_.rank() == 0) {
          const std::string served = runner.served_by(s) + " (not " + algo.name + ")";
          print_row(bytes, count, Measure{}, Measure{}, served);
          rows.push_back(row_json(algo, bytes, count, Measure{}, Measure{}, served));
        }
        continue;
      }
      const Measure oop = measure(runner, s, false, k);
      // The fused operation's in-place form would add the residual into itself every iteration.
      const bool no_in_place = o_.op == Collective::kAllToAll ||
                               algo.kind == BenchAlgo::Kind::kMemcpy || o_.add_rmsnorm ||
                               !oop.failure.empty();
      Measure ip = no_in_place ? Measure{} : measure(runner, s, true, k);
      total_wrong += static_cast<std::int64_t>(oop.wrong + ip.wrong);
      const bool failed = !oop.failure.empty() || !ip.failure.empty();
      if (boot_.rank() == 0) {
        const std::string served = runner.served_by(s);
        print_row(bytes, count, oop, ip, served);
        rows.push_back(row_json(algo, bytes, count, oop, ip, served));
        if (progress_)
          std::fprintf(stderr, "[tpcomm bench] %s %s%s: %zu/%zu sizes\n", algo.name.c_str(),
                       op_name().c_str(), round_label().c_str(), k + 1, sizes);
      }
      if (failed) return false;
    }
    return true;
  }

  Stream stream() const { return reinterpret_cast<Stream>(stream_); }

  /// ", round 2/3" in an audit.
  std::string round_label() const {
    return o_.audit
               ? ", round " + std::to_string(round_ + 1) + "/" + std::to_string(o_.audit_repeats)
               : std::string();
  }

  std::string op_name() const { return bench_op_name(o_); }

  /// Points of the sweep: the sizes, or the LM head's token counts.
  std::size_t sweep_size() const { return o_.lm_head ? o_.tokens.size() : bench_sizes(o_).size(); }

  /// Element counts of both buffers at point `k` of the sweep. The LM head: every rank's
  /// [world x tokens, ceil(vocab / world)] shards in, [tokens, vocab] out.
  Shape shape_at(std::size_t k) const {
    const int world = boot_.world_size();
    if (o_.lm_head) {
      const std::int64_t rows = o_.tokens[k];
      return {world * rows * ((o_.vocab + world - 1) / world), rows * o_.vocab};
    }
    const std::int64_t size = bench_sizes(o_)[k];
    if (o_.add_rmsnorm) {
      // The MoE finalize's input is its expert rows: top-k a token (bench_runner.cpp); the
      // sequence-parallel form's outputs are this rank's rows.
      const std::int64_t count = fused_count(o_, size, world);
      if (o_.scattered) return {count, count / world};
      return {o_.moe ? count * o_.top_k : count, count};
    }
    return shape_of(o_.op, bench_count(o_.op, size, o_.dtype, world), world);
  }

  /// Counts the wrong elements of `out` after one operation of `runner` on `fill_data(seed)`
  /// inputs.
  void check_output(const Runner& runner, const void* out, const Shape& s, std::uint64_t seed) {
    const int world = boot_.world_size();
    if (o_.lm_head) {
      const std::int64_t rows = s.out / o_.vocab;
      kernels::check_lm_head(out, o_.dtype, rows, o_.vocab, s.in / (rows * world),
                             rows * boot_.rank(), seed, bufs_.wrong, stream());
      return;
    }
    if (o_.gather && boot_.rank() != o_.root) return;  // only the root receives
    const Runner::Checked c = runner.checked(s);
    kernels::check_data(out, o_.dtype, c.count, seed, boot_.rank(), world, o_.redop, c.op, o_.root,
                        bufs_.wrong, stream());
  }

  /// Input and output pointers of one column: in place, the output is the input buffer
  /// (all-gather: this rank's slot of it; reduce-scatter: this rank's slice of the input).
  std::pair<void*, void*> pointers(const Shape& s, bool in_place) const {
    const auto es = static_cast<std::int64_t>(dtype_size(o_.dtype));
    char* in = static_cast<char*>(bufs_.in) + o_.unalign * es;
    char* out = static_cast<char*>(bufs_.out) + o_.unalign * es;
    if (!in_place) return {in, out};
    const int r = boot_.rank();
    switch (o_.op) {
      case Collective::kAllGather:
        return {in + r * s.in * es, in};
      case Collective::kReduceScatter:
        return {in, in + r * s.out * es};
      default:
        return {in, in};
    }
  }

  std::uint64_t seed_for(std::size_t size_index, bool in_place, int iteration) const {
    return seed_ ^ (static_cast<std::uint64_t>(size_index) << 20) ^ (in_place ? 0x9000000ull : 0) ^
           (static_cast<std::uint64_t>(iteration) << 40);
  }

  /// Fresh exact input, poisoned output, one operation, bitwise check.
  std::uint64_t check_once(Runner& runner, const Shape& s, bool in_place, std::uint64_t seed,
                           std::string& failure) {
    auto [in, out] = pointers(s, in_place);
    *bufs_.wrong_host = 0;  // nothing in flight reads it: the last check ended synchronised
    kernels::poison(bufs_.out, bufs_.out_bytes, stream());
    if (in_place) kernels::poison(bufs_.in, bufs_.in_bytes, stream());
    // Broadcast non-roots and in-place outputs start poisoned; inputs get this rank's values.
    const bool fill = o_.op != Collective::kBroadcast || boot_.rank() == o_.root;
    if (fill) kernels::fill_data(in, o_.dtype, s.in, seed, boot_.rank(), o_.redop, 0, stream());
    if (Status st = runner.run(in, out, s, stream()); st != Status::kOk) {
      failure = std::string(to_string(st)) + ": " + runner.last_error();
      return 0;
    }
    check_output(runner, out, s, seed);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      failure = cudaGetErrorString(e);
    return bufs_.read_wrong();
  }

  Measure measure(Runner& runner, const Shape& s, bool in_place, std::size_t size_index) {
    Measure m;
    m.ran = true;
    auto [in, out] = pointers(s, in_place);
    TPCOMM_LOG_DEBUG("bench rank ", boot_.rank(), ": ", s.in, " elements",
                     in_place ? " in place" : "", ": checking");
    std::uint64_t wrong = 0;
    const int checks = runner.checkable() ? o_.check : 0;
    for (int i = 0; i < checks && m.failure.empty(); ++i)
      wrong += check_once(runner, s, in_place, seed_for(size_index, in_place, i), m.failure);
    // Never time on zeros: refill with exact data before timing.
    kernels::fill_data(in, o_.dtype, s.in, seed_ ^ 0x5151, boot_.rank(), o_.redop, 0, stream());
    for (int i = 0; i < o_.warmup && m.failure.empty(); ++i)
      if (Status st = runner.run(in, out, s, stream()); st != Status::kOk)
        m.failure = std::string(to_string(st)) + ": " + runner.last_error();
    TPCOMM_LOG_DEBUG("bench rank ", boot_.rank(), ": timing");
    double t = 0;
    if (m.failure.empty())
      t = o_.graph ? time_graph(runner, in, out, s, m) : time_eager(runner, in, out, s, m);
    if (o_.graph && m.failure.empty() && !in_place && checks > 0) {
      // The captured path, checked too: refill, poison, replay once.
      m.failure = check_graph(runner, s, size_index, wrong);
    }
    graph_
        ->reset();  // NOTE [graphs of virtual ranks] (tune/graph_timer.hpp): before the collective
    TPCOMM_LOG_DEBUG("bench rank ", boot_.rank(), ": timed ", t, " us",
                     m.failure.empty() ? "" : ", failed: ", m.failure);
    // Average the time over ranks and sum the errors, as nccl-tests does.
    struct Result {
      double t;
      std::uint64_t wrong;
      std::int32_t failed;
    } mine{t, wrong, m.failure.empty() ? 0 : 1};
    auto all = boot_.all_gather_value(mine);
    double sum = 0;
    m.wrong = 0;
    for (const Result& r : all) {
      sum += r.t;
      m.wrong += r.wrong;
      if (r.failed && m.failure.empty()) m.failure = "failed on another rank";
    }
    m.time_us = sum / static_cast<double>(all.size());
    return m;
  }

  /// Enqueues the timed operations (each between `cold_`'s marks with --cold). Empty, or what
  /// failed.
  std::string enqueue_timed(Runner& runner, void* in, void* out, const Shape& s) {
    for (int i = 0; i < o_.iters; ++i) {
      if (cold_)
        if (std::string f = cold_->before(i); !f.empty()) return f;
      if (Status st = runner.run(in, out, s, stream()); st != Status::kOk)
        return std::string(to_string(st)) + ": " + runner.last_error();
      if (cold_)
        if (std::string f = cold_->after(i); !f.empty()) return f;
    }
    return {};
  }

  double time_eager(Runner& runner, void* in, void* out, const Shape& s, Measure& m) {
    boot_.barrier();
    cudaEventRecord(start_, stream_);
    m.failure = enqueue_timed(runner, in, out, s);
    cudaEventRecord(stop_, stream_);
    if (cudaError_t e = cudaEventSynchronize(stop_); e != cudaSuccess)
      m.failure = cudaGetErrorString(e);
    if (cold_) return cold_->mean_us();
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, stop_);
    return ms * 1000.0 / o_.iters;
  }

  /// --cold --graph: `graph_replays` replays, each after a barrier and read when it ends (the
  /// marks are the graph's own); the median of their means.
  std::string time_cold_replays(double* us) {
    std::vector<double> each;
    for (int r = -1; r < o_.graph_replays; ++r) {  // replay -1 warms up
      cudaStreamSynchronize(stream_);
      boot_.barrier();  // NOTE [graphs of virtual ranks]
      if (std::string f = graph_->replay(); !f.empty()) return f;
      if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
        return cudaGetErrorString(e);
      if (r >= 0) each.push_back(cold_->mean_us());
    }
    std::sort(each.begin(), each.end());
    *us = each[each.size() / 2];
    return {};
  }

  /// Captures `iters` operations into one graph and returns the median time per operation over
  /// `graph_replays` replays (`GraphTimer`, NOTE [graphs of virtual ranks]).
  double time_graph(Runner& runner, void* in, void* out, const Shape& s, Measure& m) {
    cudaStreamSynchronize(stream_);  // no rank captures while its kernels are in flight
    boot_.barrier();
    std::optional<Group::CaptureScope> scope;
    if (runner.group() != nullptr) scope.emplace(runner.group()->capture(stream()));
    m.failure = graph_->capture([&] {
      std::string f = enqueue_timed(runner, in, out, s);
      cudaEventRecord(stop_, stream_);  // keeps the capture valid even with zero launches
      return f;
    });
    if (scope) {
      if (Status st = scope->close(); st != Status::kOk && m.failure.empty())
        m.failure = std::string("capture registration: ") + runner.last_error();
    }
    if (!m.failure.empty()) return 0;
    double us = 0;
    m.failure = cold_ ? time_cold_replays(&us) : graph_->time(boot_, o_.graph_replays, &us);
    if (m.failure.empty() && runner.group() != nullptr && runner.group()->health() != Status::kOk)
      m.failure = runner.group()->last_error();
    return cold_ ? us : us / o_.iters;
  }

  std::string check_graph(Runner& runner, const Shape& s, std::size_t size_index,
                          std::uint64_t& wrong) {
    auto [in, out] = pointers(s, false);
    const std::uint64_t seed = seed_for(size_index, false, 1000);
    *bufs_.wrong_host = 0;
    kernels::poison(bufs_.out, bufs_.out_bytes, stream());
    if (o_.op != Collective::kBroadcast || boot_.rank() == o_.root)
      kernels::fill_data(in, o_.dtype, s.in, seed, boot_.rank(), o_.redop, 0, stream());
    // NOTE [graphs of virtual ranks]: every rank ready before any rank replays, and nothing
    // but the replay between the barrier and the wait for it.
    cudaStreamSynchronize(stream_);
    boot_.barrier();
    if (std::string f = graph_->replay(); !f.empty()) return f;
    cudaStreamSynchronize(stream_);
    check_output(runner, out, s, seed);
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      return cudaGetErrorString(e);
    wrong += bufs_.read_wrong();
    if (runner.group() != nullptr && runner.group()->health() != Status::kOk)
      return runner.group()->last_error();
    return {};
  }

  void print_header(const BenchAlgo& algo) {
    if (boot_.rank() != 0) return;
    std::printf("#\n# algo: %s%s\n", algo.name.c_str(), o_.graph ? " (CUDA graph replay)" : "");
    std::printf("#%64s%36s\n", "out-of-place", "in-place");
    std::printf("#%11s %12s %9s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s  %s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                "busbw", "#wrong", "served by");
    std::printf("#%11s %12s %9s %6s %5s %9s %8s %8s %7s %9s %8s %8s %7s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  }

  std::string column(std::int64_t bytes, const Measure& m) const {
    char buf[96];
    if (!m.ran) return "      n/a      n/a      n/a     n/a";
    if (!m.failure.empty()) return "   failed        -        -       -";
    const double algbw = static_cast<double>(bytes) / (m.time_us * 1e3);
    const double busbw = algbw * bus_factor(o_.op, boot_.world_size());
    std::snprintf(buf, sizeof(buf), " %9.2f %8.2f %8.2f %7llu", m.time_us, algbw, busbw,
                  static_cast<unsigned long long>(m.wrong));
    return buf;
  }

  void print_row(std::int64_t bytes, std::int64_t count, const Measure& oop, const Measure& ip,
                 const std::string& served) {
    const int root = o_.op == Collective::kBroadcast ? o_.root : -1;
    std::printf(" %11lld %12lld %9s %6s %5d%s%s  %s\n", static_cast<long long>(bytes),
                static_cast<long long>(count), std::string(to_string(o_.dtype)).c_str(),
                std::string(to_string(o_.redop)).c_str(), root, column(bytes, oop).c_str(),
                column(bytes, ip).c_str(), served.c_str());
    for (const Measure* m : {&oop, &ip})
      if (!m->failure.empty()) std::printf("#   failure: %s\n", m->failure.c_str());
    std::fflush(stdout);
  }

  nlohmann::json row_json(const BenchAlgo& algo, std::int64_t bytes, std::int64_t count,
                          const Measure& oop, const Measure& ip, const std::string& served) const {
    auto col = [&](const Measure& m) -> nlohmann::json {
      if (!m.ran) return nullptr;
      if (!m.failure.empty()) return {{"failure", m.failure}};
      const double algbw = static_cast<double>(bytes) / (m.time_us * 1e3);
      return {{"time_us", m.time_us},
              {"algbw_gbps", algbw},
              {"busbw_gbps", algbw * bus_factor(o_.op, boot_.world_size())},
              {"wrong", m.wrong}};
    };
    nlohmann::json row = {{"algo", algo.name},
                          {"op", op_name()},
                          {"size", bytes},
                          {"count", count},
                          {"type", to_string(o_.dtype)},
                          {"redop", to_string(o_.redop)},
                          {"graph", o_.graph},
                          {"world_size", boot_.world_size()},
                          {"served_by", served},
                          {"cold", o_.cold},
                          {"out_of_place", col(oop)},
                          {"in_place", col(ip)}};
    if (o_.add_rmsnorm) row["hidden"] = o_.hidden;  // the shape the size counts rows of
    if (o_.moe) row.update({{"top_k", o_.top_k}, {"shared_expert", o_.shared_expert}});
    if (o_.lm_head) row["vocab"] = o_.vocab;
    return row;
  }

  Bootstrap& boot_;
  int device_;
  const BenchOptions& o_;
  std::uint64_t seed_;
  Buffers bufs_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  std::unique_ptr<GraphTimer> graph_;  // on `stream_`
  std::unique_ptr<ColdTimer> cold_;    // with --cold, on `stream_`
  int round_ = 0;                      // of an audit
  // Progress lines: on a terminal, unless --quiet.
  bool progress_ = !o_.quiet && isatty(STDERR_FILENO) != 0;
  std::int64_t max_input_bytes_ = 0;  // the sweep's largest input per rank
};

int run_bench(const BenchOptions& o) {
  if (!o.json.empty()) {
    if (const std::string why = check_writable(o.json); !why.empty()) {
      std::fprintf(stderr, "tpcomm bench: --json \"%s\": %s\n", o.json.c_str(), why.c_str());
      return 1;
    }
  }
  RankPlan plan{o.virtual_ranks, o.gpus, o.timeout_s, {}};
  std::uint64_t seed = o.seed;
  if (const char* s = std::getenv("TPCOMM_BENCH_SEED"); s != nullptr && seed == 0)
    seed = std::strtoull(s, nullptr, 10);
  if (seed == 0)
    seed = (static_cast<std::uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  plan.child_env.emplace_back("TPCOMM_BENCH_SEED", std::to_string(seed));
  const std::string mode = rank_mode(plan);
  return for_each_rank(plan, [&](Bootstrap& boot, int device) {
    // Every rank must use the same data. Ranks started by another launcher (torchrun, mpirun,
    // `tpcomm launch`) each drew their own seed: rank 0's decides.
    const std::uint64_t shared_seed = boot.broadcast_value(seed, 0);
    if (boot.rank() == 0) print_banner(o, boot.world_size(), mode.c_str(), shared_seed);
    nlohmann::json rows = nlohmann::json::array();
    Bench b(boot, device, o, shared_seed);
    const std::int64_t wrong = b.run(rows);
    if (boot.rank() != 0) return wrong < 0 ? 1 : (wrong == 0 ? 0 : 2);
    return finish_bench(o, rows, wrong, boot.world_size());
  });
}

}  // namespace

void add_bench_command(CLI::App& app, Command& run) {
  auto* cmd =
      app.add_subcommand("bench", "nccl-tests-style sweep of a collective over every algorithm");
  auto o = std::make_shared<BenchOptions>();
  // Scheduled by the options' own checks, once they pass (NOTE [one callback per command]).
  add_bench_options(*cmd, *o, [o, &run] { run = [o] { return run_bench(*o); }; });
}

}  // namespace tpcomm::tools
