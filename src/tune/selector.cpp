// SPDX-License-Identifier: Apache-2.0
// The all-reduce selector. Pure functions only: see the rank-invariance note in the header.
#include "tune/selector.hpp"

#include <algorithm>

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
  const std::int64_t blocks = std::clamp<std::int64_t>(ceil_div(vectors, kDefaultThreads), 1, cap);
  return Choice{algo, static_cast<int>(blocks), kDefaultThreads};
}

Choice built_in_choice(std::int64_t bytes, DType dtype, const SelectorCaps& caps,
                       bool allow_push) noexcept {
  const AlgoInfo* best = nullptr;
  for (const AlgoInfo& a : kAlgorithms) {
    if (a.built_in.order == 0 || (best != nullptr && a.built_in.order >= best->built_in.order))
      continue;
    if (kernels::pushes(a.kernel) &&
        (!allow_push || !fits(a.algo, bytes, dtype, caps.world_size, caps.lamport_max_bytes)))
      continue;
    if (bytes <= a.built_in.bound(caps.world_size)) best = &a;
  }
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
    if (auto tuned = table->lookup(bytes)) return serve(*tuned);
  }
  return built_in_choice(bytes, dtype, caps, /*allow_push=*/true);
}

}  // namespace tpcomm
