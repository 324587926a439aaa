// SPDX-License-Identifier: Apache-2.0
// Builds the tuned table from measurements of every candidate (algorithm x launch shape).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tpcomm/bootstrap.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"

namespace tpcomm {

/// Microseconds per all-reduce of `bytes` bytes of bf16 with `choice`. Collective: every rank
/// times the same candidates in the same order. Throws `Error` when the measurement fails.
using TimeCandidate = std::function<double(const Choice& choice, std::int64_t bytes)>;

/// Times every `tune_candidates` for every size bucket of `TuneTable::bucket_bounds(
/// caps.max_bytes)` with `time`. Rank 0's times decide (broadcast), so every rank returns the
/// same table; within 3% of the fastest counts as a tie, and ties go to fewer blocks. Collective.
TuneTable tune_all_reduce(const SelectorCaps& caps, Bootstrap& boot, const TuneKey& key,
                          const TimeCandidate& time);

/// The row length the tuner measures the fused operation at: `tune_fused_hidden(bytes)`
/// elements per row, as many rows as `bytes` of bf16 hold (a model's hidden size; one row below
/// that).
inline constexpr std::int64_t kTuneHidden = 4096;
constexpr std::int64_t tune_fused_hidden(std::int64_t bytes) noexcept {
  return bytes / 2 >= kTuneHidden ? kTuneHidden : (bytes / 2 > 0 ? bytes / 2 : 1);
}

/// Times the fallback (`Choice{}`: the all-reduce, then the local add + RMSNorm) and every
/// algorithm that fuses (with `fused_launch`'s shape) for the fused all-reduce + residual add +
/// RMSNorm, per size bucket up to what the Lamport buffers hold, with `time` (the bytes of the
/// input: `tune_fused_hidden` elements per row). Rank 0's times decide, as in `tune_all_reduce`
/// (ties go to the fallback); the buckets of the table's `fused` lines.
std::vector<TuneEntry> tune_fused(const SelectorCaps& caps, Bootstrap& boot,
                                  const TimeCandidate& time);

/// Microseconds per exchange with `choice` in which every rank receives `bytes` bytes: an
/// equal-split all-to-all of `bytes` per rank. Collective, as `TimeCandidate`.
using TimeExchange = std::function<double(const ExchangeChoice& choice, std::int64_t bytes)>;

/// Times every `exchange_candidates` per size bucket (bytes received by a rank) of
/// `TuneTable::bucket_bounds(caps.exchange_max_bytes)` with `time`; rank 0's times decide, as in
/// `tune_all_reduce`. The buckets of the table's `exchange` lines. Only the custom exchange is
/// measured (NCCL is not a candidate here: it serves what the staging cannot hold). Collective.
std::vector<ExchangeEntry> tune_exchange(const SelectorCaps& caps, Bootstrap& boot,
                                         const TimeExchange& time);

/// The exchange's candidates for one bucket, fewest blocks first: every exchange algorithm that
/// fits the equal-split all-to-all of `bytes` per rank (`fits`: the push form's pieces of
/// `bytes` / world size in the Lamport slots) in every launch shape of `kTunerThreads` x
/// `kTunerBlocks` up to the algorithm's and the group's block limits and one step past one
/// 16-byte access per thread.
std::vector<ExchangeChoice> exchange_candidates(std::int64_t bytes, const SelectorCaps& caps);

/// The candidates measured for one bucket, fewest blocks first (so ties go to fewer blocks):
/// every algorithm of the registry that fits `bytes` bytes of bf16 (the dtype the tuner
/// measures) with `caps`, in every launch shape of `kTunerThreads` x `kTunerBlocks` up to the
/// algorithm's and the group's block limits and one step past one 16-byte pack per thread.
std::vector<Choice> tune_candidates(std::int64_t bytes, const SelectorCaps& caps);

}  // namespace tpcomm
