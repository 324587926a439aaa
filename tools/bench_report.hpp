// SPDX-License-Identifier: Apache-2.0
// `tpcomm bench`'s report around the rows: the banner, the summary, the audit and the JSON file.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "tools/bench_args.hpp"

namespace tpcomm::tools {

/// The lines before the rows: the collective, the ranks, the GPU, the sweep and how it is timed.
void print_banner(const BenchOptions& o, int world, const char* mode, std::uint64_t seed);

/// The lines after the rows (and, with `--audit`, the audit's comparison), and the JSON file.
/// `wrong` < 0 after a failure. Returns the exit code: 0, 1 (a failure or a lost report), 2
/// (wrong results).
int finish_bench(const BenchOptions& o, nlohmann::json& rows, std::int64_t wrong, int world);

}  // namespace tpcomm::tools
