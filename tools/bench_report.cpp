// SPDX-License-Identifier: Apache-2.0
#include "tools/bench_report.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "tools/audit.hpp"
#include "tools/json_file.hpp"

namespace tpcomm::tools {
namespace {

/// What the size column counts, for the banner.
const char* size_meaning(const BenchOptions& o) {
  if (o.lm_head) return "bytes of each rank's output ([tokens, vocab] logits)";
  if (o.moe)
    return "bytes of x, each rank's combined rows (its top-k expert rows are top-k times that)";
  if (o.scattered)
    return "bytes of x, each rank's [tokens, hidden] input, tokens rounded up to a multiple of the "
           "world size (its outputs are its tokens / world rows)";
  if (o.add_rmsnorm) return "bytes of x, each rank's input rows";
  switch (o.op) {
    case kernels::Collective::kAllGather:
      return o.gather ? "bytes of the root's output (each rank's input is size / world)"
                      : "bytes of each rank's output (each rank's input is size / world)";
    case kernels::Collective::kReduceScatter:
      return "bytes of each rank's input (its output is size / world)";
    default:
      return "bytes of each rank's input and of its output";
  }
}

/// Prints the audit's comparison of every point and its losses; returns them as JSON.
nlohmann::json print_audit(const nlohmann::json& rows, int repeats) {
  const std::vector<AuditPoint> points = audit_points(rows);
  nlohmann::json out = nlohmann::json::array();
  int losses = 0;
  std::printf("# audit: the built-in choice (auto) against the fastest path, median of %d\n",
              repeats);
  std::printf("#%11s %10s %-28s %10s %-16s %-28s %8s %7s\n", "size", "auto (us)", "auto path",
              "best (us)", "best", "best path", "margin", "ratio");
  for (const AuditPoint& p : points) {
    losses += p.loss ? 1 : 0;
    std::printf(" %11lld %10.2f %-28s %10.2f %-16s %-28s %8.2f %7.3f%s\n",
                static_cast<long long>(p.size), p.builtin_us, p.builtin_path.c_str(), p.best_us,
                p.best_algo.c_str(), p.best_path.c_str(), p.margin_us(), p.ratio(),
                p.loss ? "  LOSS" : "");
    out.push_back({{"op", p.op},
                   {"size", p.size},
                   {"world_size", p.world_size},
                   {"builtin_path", p.builtin_path},
                   {"builtin_us", p.builtin_us},
                   {"best_algo", p.best_algo},
                   {"best_path", p.best_path},
                   {"best_us", p.best_us},
                   {"loss", p.loss}});
  }
  std::printf(
      "# audit: %d of %zu points slower than the fastest path by more than max(3%%, "
      "0.2 us)\n#\n",
      losses, points.size());
  return out;
}

}  // namespace

void print_banner(const BenchOptions& o, int world, const char* mode, std::uint64_t seed) {
  int driver = 0, devices = 0;
  cudaDriverGetVersion(&driver);
  cudaGetDeviceCount(&devices);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::string op = bench_op_name(o);
  if (o.lm_head) op += ", vocab " + std::to_string(o.vocab);
  if (o.gather) op += " to rank " + std::to_string(o.root);
  if (o.add_rmsnorm) op += ", hidden " + std::to_string(o.hidden);
  if (o.moe) op += ", top-" + std::to_string(o.top_k) + (o.shared_expert ? ", shared expert" : "");
  std::printf("# tpcomm bench %s: %s, %d rank(s) (%s), %d GPU(s) visible: %s, driver %d\n",
              TPCOMM_VERSION, op.c_str(), world, mode, devices, prop.name, driver);
  std::string sweep =
      "sizes " + std::to_string(o.min_bytes) + ".." + std::to_string(o.max_bytes) + " B";
  if (o.lm_head) {
    sweep = "tokens per rank";
    for (std::size_t i = 0; i < o.tokens.size(); ++i)
      sweep += (i == 0 ? " " : ",") + std::to_string(o.tokens[i]);
  }
  std::printf("# %s, %s%s, iters %d, warmup %d, check %d, unalign %lld, seed %llu\n", sweep.c_str(),
              o.graph ? "CUDA graph replay (median)" : "eager (mean)",
              o.cold ? ", L2 evicted before each operation" : "", o.iters, o.warmup, o.check,
              static_cast<long long>(o.unalign), static_cast<unsigned long long>(seed));
  std::printf("# size: %s\n", size_meaning(o));
}

int finish_bench(const BenchOptions& o, nlohmann::json& rows, std::int64_t wrong, int world) {
  if (wrong < 0) {
    std::printf("# a collective failed: see the failure lines above\n");
    return 1;
  }
  double sum = 0;
  int n = 0;
  for (const auto& r : rows)
    for (const char* col : {"out_of_place", "in_place"})
      if (r[col].is_object() && r[col].contains("busbw_gbps")) {
        sum += r[col]["busbw_gbps"].get<double>();
        ++n;
      }
  std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
              wrong == 0 ? "OK" : "FAILED");
  std::printf("# Avg bus bandwidth    : %g\n#\n", n ? sum / n : 0.0);
  nlohmann::json audit;
  if (o.audit) audit = print_audit(rows, o.audit_repeats);
  if (!o.json.empty()) {
    nlohmann::json doc{{"tool", "tpcomm bench"},
                       {"version", TPCOMM_VERSION},
                       {"world_size", world},
                       {"wrong", wrong},
                       {"rows", rows}};
    if (o.audit) doc["audit"] = audit;
    if (const std::string why = write_json_file(o.json, doc); !why.empty()) {
      std::fprintf(stderr, "tpcomm bench: --json \"%s\": %s\n", o.json.c_str(), why.c_str());
      // Wrong results keep their own exit code; a lost report alone is a failure.
      return wrong == 0 ? 1 : 2;
    }
  }
  return wrong == 0 ? 0 : 2;
}

}  // namespace tpcomm::tools
