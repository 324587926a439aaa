// SPDX-License-Identifier: Apache-2.0
// Measures the custom all-reduce candidates and builds the tuned table.
#pragma once

#include "backends/custom_ar.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tune/table.hpp"

namespace tpcomm {

/// Times every candidate (algorithm x blocks x threads) for every size bucket of
/// `TuneTable::bucket_bounds(ar.caps().max_bytes)`, each as a CUDA graph of back-to-back bf16
/// all-reduces replayed several times on a private stream. All ranks measure the same
/// candidates in the same order (each is a collective); rank 0's times decide, so every rank
/// returns the same table. Collective; throws `Error` when a measurement fails (a timed-out
/// peer, a CUDA error).
TuneTable tune_custom_all_reduce(CustomAllReduce& ar, Bootstrap& boot, int device,
                                 const TuneKey& key);

/// The candidates measured for one bucket, fewest blocks first (so ties go to fewer blocks):
/// one-shot, two-shot, and the Lamport kernels where their buffers hold `bytes` (the tuner
/// measures bf16, which they serve).
std::vector<Choice> tune_candidates(std::int64_t bytes, const SelectorCaps& caps);

}  // namespace tpcomm
