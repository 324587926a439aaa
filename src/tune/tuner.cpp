// SPDX-License-Identifier: Apache-2.0
#include "tune/tuner.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include "core/log.hpp"

namespace tpcomm {
namespace {

/// A candidate within this fraction of the fastest counts as a tie; ties go to fewer blocks
/// (fewer SMs taken from the compute around the all-reduce), as NCCL's symmetric-kernel model
/// does.
constexpr double kTie = 0.03;

}  // namespace

std::vector<Choice> tune_candidates(std::int64_t bytes, const SelectorCaps& caps) {
  std::vector<Choice> out;
  const int world_size = caps.world_size;
  const std::int64_t packs = (bytes + 15) / 16;
  for (const AlgoInfo& a : kAlgorithms) {
    if (!fits(a.algo, bytes, DType::kBF16, world_size, caps.lamport_max_bytes)) continue;
    const std::int64_t work =
        kernels::sliced(a.kernel) ? (packs + world_size - 1) / world_size : packs;
    const int max_blocks = std::min(caps.max_blocks, a.max_blocks);
    for (int threads : kTunerThreads) {
      if (threads > kernels::max_threads(a.kernel)) continue;
      // Blocks beyond one pack per thread only idle; keep one step past that.
      const std::int64_t useful = std::max<std::int64_t>(1, (work + threads - 1) / threads);
      for (int blocks : kTunerBlocks) {
        if (blocks > max_blocks || blocks > 2 * useful) break;
        out.push_back({a.algo, blocks, threads});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Choice& a, const Choice& b) { return a.blocks < b.blocks; });
  return out;
}

namespace {

/// Times `candidates` (not empty) for one bucket; rank 0's times decide.
/// "all-reduce 3/14" for the log line of bucket `k` of `n`: what is measured, and how far along.
std::string stage(const char* what, std::size_t k, std::size_t n) {
  return detail::concat(what, " ", k + 1, "/", n);
}

template <class C, class Time>
std::pair<C, double> pick_one(const std::vector<C>& candidates, std::int64_t bytes, Bootstrap& boot,
                              const Time& time, const std::string& what) {
  std::vector<double> times;
  times.reserve(candidates.size());
  for (const C& c : candidates) times.push_back(time(c, bytes));
  // Rank 0's measurements decide for everyone.
  auto shared = boot.broadcast(std::as_bytes(std::span(times)), 0);
  std::memcpy(times.data(), shared.data(), std::min(shared.size(), times.size() * sizeof(double)));
  const double best = *std::min_element(times.begin(), times.end());
  std::size_t i = 0;
  while (times[i] > best * (1.0 + kTie)) ++i;
  if (boot.rank() == 0)
    TPCOMM_LOG_INFO("tune ", what, ": ", bytes, " B: ", to_string(candidates[i]), ", ", times[i],
                    " us (", candidates.size(), " candidates)");
  return {candidates[i], times[i]};
}

TuneEntry pick(const std::vector<Choice>& candidates, std::int64_t bytes, Bootstrap& boot,
               const TimeCandidate& time, const std::string& what) {
  const auto [choice, us] = pick_one(candidates, bytes, boot, time, what);
  return {bytes, choice, us};
}

}  // namespace

TuneTable tune_all_reduce(const SelectorCaps& caps, Bootstrap& boot, const TuneKey& key,
                          const TimeCandidate& time) {
  std::vector<TuneEntry> entries;
  const std::vector<std::int64_t> buckets = TuneTable::bucket_bounds(caps.max_bytes);
  for (std::size_t k = 0; k < buckets.size(); ++k)
    entries.push_back(pick(tune_candidates(buckets[k], caps), buckets[k], boot, time,
                           stage("all-reduce", k, buckets.size())));
  return TuneTable(key, std::move(entries));
}

std::vector<TuneEntry> tune_fused(const SelectorCaps& caps, Bootstrap& boot,
                                  const TimeCandidate& time) {
  std::vector<TuneEntry> entries;
  if (caps.lamport_max_bytes <= 0) return entries;
  // The largest input (a power of two, within the staging size) some algorithm that fuses can
  // carry.
  std::int64_t most = 0;
  for (std::int64_t b = 512; b <= caps.max_bytes; b *= 2) {
    bool any = false;
    for (const AlgoInfo& a : kAlgorithms)
      any = any || (kernels::fuses(a.kernel) &&
                    fits(a.algo, b, DType::kBF16, caps.world_size, caps.lamport_max_bytes));
    if (!any) break;
    most = b;
  }
  if (most == 0) return entries;
  const std::vector<std::int64_t> buckets = TuneTable::bucket_bounds(most);
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const std::int64_t bytes = buckets[k];
    const std::int64_t hidden = tune_fused_hidden(bytes);
    const std::int64_t rows = std::max<std::int64_t>(1, bytes / 2 / hidden);
    // `Choice{}`: the fallback (the all-reduce, then the local add + RMSNorm).
    std::vector<Choice> candidates{Choice{}};
    for (const AlgoInfo& a : kAlgorithms)
      if (kernels::fuses(a.kernel) &&
          fits(a.algo, rows * hidden * 2, DType::kBF16, caps.world_size, caps.lamport_max_bytes))
        candidates.push_back(
            fused_launch(a.algo, rows, hidden, caps.max_blocks, caps.max_cluster_blocks));
    entries.push_back(pick(candidates, bytes, boot, time, stage("fused", k, buckets.size())));
  }
  return entries;
}

std::vector<ExchangeChoice> exchange_candidates(std::int64_t bytes, const SelectorCaps& caps) {
  std::vector<ExchangeChoice> out;
  const std::int64_t accesses = (bytes + 15) / 16;
  const std::int64_t piece = std::max<std::int64_t>(16, bytes / std::max(1, caps.world_size));
  for (const ExchangeInfo& e : kExchangeAlgorithms) {
    if (!fits(e.algo, kernels::exchange_push_slot_bytes(piece), caps.lamport_max_bytes)) continue;
    const int max_blocks = std::min(caps.max_blocks, e.max_blocks);
    for (int threads : kTunerThreads) {
      const std::int64_t useful = std::max<std::int64_t>(1, (accesses + threads - 1) / threads);
      for (int blocks : kTunerBlocks) {
        if (blocks > max_blocks || blocks > 2 * useful) break;
        out.push_back({e.algo, blocks, threads});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const ExchangeChoice& a, const ExchangeChoice& b) {
    return a.blocks < b.blocks;
  });
  return out;
}

std::vector<ExchangeEntry> tune_exchange(const SelectorCaps& caps, Bootstrap& boot,
                                         const TimeExchange& time) {
  std::vector<ExchangeEntry> entries;
  if (caps.exchange_max_bytes <= 0) return entries;
  const std::vector<std::int64_t> buckets = TuneTable::bucket_bounds(caps.exchange_max_bytes);
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const std::int64_t bytes = buckets[k];
    const auto [choice, us] = pick_one(exchange_candidates(bytes, caps), bytes, boot, time,
                                       stage("exchange", k, buckets.size()));
    entries.push_back({bytes, choice, us});
  }
  return entries;
}

}  // namespace tpcomm
