// SPDX-License-Identifier: Apache-2.0
// The all-reduce selector. Pure functions only: see the rank-invariance note in the header.
#include "tune/selector.hpp"

#include <algorithm>

#include "kernels/common/lines.hpp"

namespace tpcomm {
namespace {

/// The unit of work of the kernels: one 16-byte (128-bit) load or store.
constexpr std::int64_t kVectorBytes = 16;

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) noexcept {
  return a / b + (a % b != 0 ? 1 : 0);
}

bool custom_dtype(DType t) noexcept {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

Choice clamp_blocks(Choice c, int max_blocks) noexcept {
  if (c.algo != Algo::kNone) c.blocks = std::min(c.blocks, max_blocks);
  return c;
}

}  // namespace

Choice default_launch(Algo algo, std::int64_t bytes, int world_size, int max_blocks) noexcept {
  if (algo == Algo::kNone) return Choice{};
  std::int64_t vectors = ceil_div(std::max<std::int64_t>(bytes, 0), kVectorBytes);
  if (kernels::sliced(info(algo).kernel)) vectors = ceil_div(vectors, std::max(world_size, 1));
  const std::int64_t cap = std::max(1, std::min(max_blocks, kDefaultMaxBlocks));
  if (kernels::pushes(info(algo).kernel) && !kernels::sliced(info(algo).kernel)) {
    // NOTE [lamport launch]; past 512 threads a block, the shape below.
    if (vectors <= std::min(kLamportSmallBlocks, cap) * kLamportThreads)
      return Choice{algo,
                    static_cast<int>(std::max<std::int64_t>(1, ceil_div(vectors, kLamportThreads))),
                    kLamportThreads};
    const std::int64_t blocks = std::min(kLamportWideBlocks, cap);
    const std::int64_t threads = ceil_div(ceil_div(vectors, blocks), 32) * 32;
    if (threads <= kDefaultThreads)
      return Choice{algo, static_cast<int>(blocks),
                    static_cast<int>(std::max<std::int64_t>(threads, kLamportThreads))};
  }
  const std::int64_t blocks = std::clamp<std::int64_t>(ceil_div(vectors, kDefaultThreads), 1, cap);
  return Choice{algo, static_cast<int>(blocks), kDefaultThreads};
}

Choice built_in_choice(std::int64_t bytes, DType dtype, const SelectorCaps& caps,
                       bool allow_push) noexcept {
  const AlgoInfo* best = nullptr;
  const AlgoInfo* widest = nullptr;  // the largest bound, for a deterministic group
  for (const AlgoInfo& a : kAlgorithms) {
    if (a.built_in.order == 0) continue;
    if (kernels::pushes(a.kernel) &&
        (!allow_push || !fits(a.algo, bytes, dtype, caps.world_size, caps.lamport_max_bytes)))
      continue;
    if (widest == nullptr ||
        a.built_in.bound(caps.world_size) > widest->built_in.bound(caps.world_size))
      widest = &a;
    if (bytes <= a.built_in.bound(caps.world_size) &&
        (best == nullptr || a.built_in.order < best->built_in.order))
      best = &a;
  }
  // NOTE [batch invariance]: past every bound, still a custom kernel.
  if (best == nullptr && caps.deterministic) best = widest;
  if (best == nullptr) return Choice{};
  return default_launch(best->algo, bytes, caps.world_size, caps.max_blocks);
}

Choice default_choice(std::int64_t bytes, int world_size, int max_blocks) noexcept {
  SelectorCaps caps;
  caps.world_size = world_size;
  caps.max_blocks = max_blocks;
  return built_in_choice(bytes, DType::kF32, caps, /*allow_push=*/false);
}

Choice select_all_reduce(std::int64_t bytes, DType dtype, ReduceOp op, const SelectorCaps& caps,
                         Pinned pinned, const TuneTable* table) noexcept {
  // Hard requirements: what the kernels can do at all.
  if (!caps.custom_available) return Choice{};
  if (caps.world_size < 2 || caps.world_size > 8) return Choice{};
  if (caps.max_blocks < 1) return Choice{};
  if (!custom_dtype(dtype) || op != ReduceOp::kSum) return Choice{};
  if (bytes <= 0 || bytes > caps.max_bytes) return Choice{};
  if (bytes % static_cast<std::int64_t>(dtype_size(dtype)) != 0) return Choice{};

  // A pinned or tuned algorithm that cannot carry this message: the built-in choice among the
  // kernels that read peers' inputs.
  auto serve = [&](Choice c) {
    if (c.algo == Algo::kNone ||
        fits(c.algo, bytes, dtype, caps.world_size, caps.lamport_max_bytes))
      return clamp_blocks(c, caps.max_blocks);
    return built_in_choice(bytes, dtype, caps, /*allow_push=*/false);
  };
  if (pinned) return serve(default_launch(*pinned, bytes, caps.world_size, caps.max_blocks));
  if (table != nullptr && table->key().world_size == caps.world_size) {
    // NOTE [batch invariance]: a bucket NCCL won is the built-in choice's in a deterministic
    // group.
    if (auto tuned = table->lookup(bytes);
        tuned && !(caps.deterministic && tuned->algo == Algo::kNone))
      return serve(*tuned);
  }
  return built_in_choice(bytes, dtype, caps, /*allow_push=*/true);
}

Choice fused_launch(Algo algo, std::int64_t rows, std::int64_t hidden, int max_blocks,
                    const ClusterBlocks& cluster_blocks) noexcept {
  if (algo == Algo::kNone) return Choice{};
  // A row that does not start on a pack boundary spans one pack more.
  const std::int64_t packs = ceil_div(std::max<std::int64_t>(hidden, 1) * 2, kVectorBytes) + 1;
  const int most = std::max(1, std::min(max_blocks, kMaxBlocks));
  rows = std::max<std::int64_t>(rows, 1);
  // Groups of blocks per row (NOTE [row groups] in kernels/common/epilogue.cuh) where one block
  // would hold more than one pack of the row in most threads (a group's barriers cost more than
  // a second pack in a few threads: measured in docs/PERFORMANCE.md), while the rows leave
  // blocks to spare, until a block holds at most 256 packs of its row; and only as large as
  // the GPU holds clusters of it for every row (clusters that do not fit wait for others).
  auto fit = [&](int g) { return rows * g <= std::min(most, cluster_blocks[cluster_index(g)]); };
  int group = 1;
  if (packs > kernels::kFusedMaxThreads + kernels::kFusedMaxThreads / 8)
    while (group < kernels::kMaxRowGroup && fit(group * 2) && packs > group * 256) group *= 2;
  int threads = 64;
  while (threads < kernels::kFusedMaxThreads && threads * group < packs) threads *= 2;
  auto blocks = static_cast<int>(std::min<std::int64_t>(rows * group, most));
  // A few rows leave the pushes and refills of a few rows to a few SMs: the Lamport one-shot
  // kernel spreads them over as many blocks as its plain all-reduce of the same bytes takes
  // (NOTE [lamport launch]), up to kLamportWideBlocks and in whole groups, the blocks past the
  // rows pushing their share and taking the refill (NOTE [row groups]), where the clusters fit.
  if (!kernels::sliced(info(algo).kernel)) {
    const int plain = default_launch(algo, rows * hidden * 2, /*world_size=*/1, most).blocks;
    const int wide =
        (std::min(plain, static_cast<int>(kLamportWideBlocks)) + group - 1) / group * group;
    if (wide <= std::min(most, group == 1 ? most : cluster_blocks[cluster_index(group)]))
      blocks = std::max(blocks, wide);
  }
  return Choice{algo, blocks, threads, group};
}

namespace {

/// `select_add_rmsnorm`, or with `scattered` `select_reduce_scatter_add_rmsnorm`.
Choice select_fused(std::int64_t rows, std::int64_t hidden, DType dtype, const SelectorCaps& caps,
                    Pinned pinned, const TuneTable* table, const char** why,
                    bool scattered) noexcept {
  const char* ignored = nullptr;
  if (why == nullptr) why = &ignored;
  *why = nullptr;
  auto no = [&](const char* reason) {
    *why = reason;
    return Choice{};
  };
  if (!caps.custom_available) return no("no custom all-reduce");
  if (caps.world_size < 2 || caps.world_size > 8) return no("world size outside 2..8");
  if (caps.max_blocks < 1) return no("no blocks");
  if (caps.lamport_max_bytes <= 0) return no("the group carries no fusion workspace");
  if (dtype != DType::kF16 && dtype != DType::kBF16) return no("the fused kernels take f16/bf16");
  if (rows < 1 || hidden < 1) return no("empty");
  const std::int64_t bytes = rows * hidden * 2;
  if (scattered && (rows % caps.world_size != 0 || bytes / caps.world_size % kVectorBytes != 0))
    return no("each rank's rows do not start on a 16-byte boundary of the message");
  // The rows a rank finishes: its own where the call is scattered (NOTE [scattered rows]).
  const std::int64_t finished = scattered ? rows / caps.world_size : rows;
  // NOTE [batch invariance]: no groups of blocks, so the sum of squares' order is the hidden
  // size's alone.
  const ClusterBlocks clusters = caps.deterministic ? ClusterBlocks{} : caps.max_cluster_blocks;
  auto usable = [&](Algo a) {
    return a != Algo::kNone && kernels::fuses(info(a).kernel) &&
           (!scattered || kernels::scatters(info(a).kernel)) &&
           fits(a, bytes, dtype, caps.world_size, caps.lamport_max_bytes);
  };
  auto launch = [&](Algo a) {
    return fused_launch(a, finished, hidden, caps.max_blocks, clusters);
  };
  if (pinned) {
    if (*pinned == Algo::kNone) return no("TPCOMM_ALGO=nccl");
    if (usable(*pinned)) return launch(*pinned);
    if (scattered && kernels::fuses(info(*pinned).kernel))
      return no("the pinned algorithm keeps every rank's sum");
  } else if (!scattered && table != nullptr && table->key().world_size == caps.world_size) {
    if (auto tuned = table->lookup_fused(bytes)) {
      if (tuned->algo == Algo::kNone && !caps.deterministic)
        return no("the tuned table: the unfused pair was faster");
      if (usable(tuned->algo)) return launch(tuned->algo);
    }
  }
  const AlgoInfo* best = nullptr;
  const AlgoInfo* first_fit = nullptr;  // the lowest order that fits, for a deterministic group
  for (const AlgoInfo& a : kAlgorithms) {
    if (a.fused.order == 0 || !usable(a.algo)) continue;
    if (first_fit == nullptr || a.fused.order < first_fit->fused.order) first_fit = &a;
    if (bytes > a.fused.bound(caps.world_size)) continue;
    if (best == nullptr || a.fused.order < best->fused.order) best = &a;
  }
  if (first_fit == nullptr)
    return no("rows x hidden beyond the fusion workspace (TPCOMM_LAMPORT_MAX_BYTES)");
  if (best == nullptr && caps.deterministic) best = first_fit;  // NOTE [batch invariance]
  if (best == nullptr)
    return no("rows x hidden past the built-in bounds, where the unfused pair is faster");
  return launch(best->algo);
}

}  // namespace

Choice select_add_rmsnorm(std::int64_t rows, std::int64_t hidden, DType dtype,
                          const SelectorCaps& caps, Pinned pinned, const TuneTable* table,
                          const char** why) noexcept {
  return select_fused(rows, hidden, dtype, caps, pinned, table, why, /*scattered=*/false);
}

Choice select_reduce_scatter_add_rmsnorm(std::int64_t rows, std::int64_t hidden, DType dtype,
                                         const SelectorCaps& caps, Pinned pinned,
                                         const char** why) noexcept {
  return select_fused(rows, hidden, dtype, caps, pinned, nullptr, why, /*scattered=*/true);
}

ExchangeChoice exchange_launch(ExchangeAlgo algo, std::int64_t largest_output,
                               const SelectorCaps& caps) noexcept {
  const int cap = std::max(1, std::min(caps.max_blocks, info(algo).max_blocks));
  if (info(algo).lamport) {
    // NOTE [exchange launch]
    const std::int64_t most = std::min<std::int64_t>(kExchangeSmallBlocks, cap);
    for (std::int64_t per_block = kExchangeSmallBytes; per_block <= kExchangeSmallBytesMost;
         per_block *= 2) {
      const std::int64_t blocks = std::max<std::int64_t>(1, ceil_div(largest_output, per_block));
      if (blocks <= most) return {algo, static_cast<int>(blocks), kExchangeSmallThreads};
    }
  }
  // The push form's threads wait for their lines: a line of data received a thread.
  constexpr auto kLineBytes = static_cast<std::int64_t>(sizeof(kernels::Line));
  const std::int64_t per_block =
      info(algo).lamport ? std::int64_t{kDefaultThreads} * kLineBytes : std::int64_t{32} << 10;
  const auto blocks = std::clamp<std::int64_t>(ceil_div(largest_output, per_block), 1, cap);
  return {algo, static_cast<int>(blocks), kDefaultThreads};
}

ExchangeChoice select_exchange(const ExchangeSize& size, const SelectorCaps& caps, Pinned pinned,
                               PinnedExchange pinned_exchange, const TuneTable* table) noexcept {
  if (!caps.custom_available || caps.world_size < 2 || caps.world_size > kMaxRanks ||
      caps.max_blocks < 1 || size.largest_input <= 0 ||
      size.largest_input > caps.exchange_max_bytes || size.largest_input >= (std::int64_t{1} << 32))
    return {};
  if (pinned && *pinned == Algo::kNone) return {};
  auto usable = [&](ExchangeAlgo a) {
    return fits(a, size.push_slot_bytes, caps.lamport_max_bytes);
  };
  if (pinned_exchange && usable(*pinned_exchange))
    return exchange_launch(*pinned_exchange, size.largest_output, caps);
  if (!pinned_exchange && table != nullptr && table->key().world_size == caps.world_size) {
    if (auto tuned = table->lookup_exchange(size.largest_output)) {
      if (tuned->algo == ExchangeAlgo::kNone) return {};
      if (usable(tuned->algo)) {
        tuned->blocks =
            std::clamp(tuned->blocks, 1, std::min(caps.max_blocks, info(tuned->algo).max_blocks));
        return *tuned;
      }
    }
  }
  const ExchangeInfo* best = nullptr;
  for (const ExchangeInfo& e : kExchangeAlgorithms)
    if (e.built_in.order > 0 && usable(e.algo) &&
        e.built_in.bound(caps.world_size) >= size.largest_region &&
        (best == nullptr || e.built_in.order < best->built_in.order))
      best = &e;
  if (best == nullptr) return {};
  return exchange_launch(best->algo, size.largest_output, caps);
}

}  // namespace tpcomm
