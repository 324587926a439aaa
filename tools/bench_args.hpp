// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench`: its options (nccl-tests' flags) and the arithmetic of its report.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::tools {

/// How an all-reduce is served in a benchmark row.
enum class BenchAlgo : std::uint8_t {
  kAuto,            // the group decides (tuned table, then NCCL)
  kOneShot,         // custom one-shot, pinned
  kTwoShot,         // custom two-shot, pinned
  kLamport,         // custom Lamport, pinned (f16/bf16 up to its buffers' size)
  kLamportTwoShot,  // custom Lamport two-shot, pinned (likewise)
  kNccl,            // the group, pinned to its NCCL backend
  kNcclDirect,      // ncclAllReduce & co. called directly on an NCCL communicator: the peer
  kMemcpy,          // a device-to-device copy of the same bytes: the one-GPU physical limit
};

std::string_view to_string(BenchAlgo a) noexcept;

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
  int root = 0;                                              // -r
  bool graph = false;                                        // --graph
  int graph_replays = 10;                                    // --graph-replays
  std::int64_t unalign = 0;                                  // -u (elements)
  std::vector<BenchAlgo> algos{BenchAlgo::kAuto};            // --algo
  std::string json;                                          // --json FILE
  int gpus = 0;            // -g N: launch N processes, one per GPU
  int virtual_ranks = 0;   // --virtual-ranks N: N threads on GPU 0
  int timeout_s = 600;     // deadline of a self-launched run
  std::uint64_t seed = 0;  // --seed (0 = random)
};

/// Adds the options to `cmd` (the `bench` subcommand) and validates them after parsing.
void add_bench_options(CLI::App& cmd, BenchOptions& o);

/// The sizes of the sweep, in bytes, as nccl-tests steps them (-f multiplies, else -i adds).
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

}  // namespace tpcomm::tools
