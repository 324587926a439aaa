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
  // Two-shot: each rank reduces, then gathers, one 1/world_size slice per peer.
  if (algo == Algo::kTwoShot || algo == Algo::kLamportTwoShot)
    vectors = ceil_div(vectors, std::max(world_size, 1));
  const std::int64_t cap = std::max(1, std::min(max_blocks, kDefaultMaxBlocks));
  const std::int64_t blocks = std::clamp<std::int64_t>(ceil_div(vectors, kDefaultThreads), 1, cap);
  return Choice{algo, static_cast<int>(blocks), kDefaultThreads};
}

Choice default_choice(std::int64_t bytes, int world_size, int max_blocks) noexcept {
  bool one_shot = world_size == 2 || (world_size <= 4 && bytes < kOneShotMaxBytesUpTo4Ranks) ||
                  bytes < kOneShotMaxBytes;
  return default_launch(one_shot ? Algo::kOneShot : Algo::kTwoShot, bytes, world_size, max_blocks);
}

Choice select_all_reduce(std::int64_t bytes, DType dtype, ReduceOp op, const SelectorCaps& caps,
                         AlgoChoice forced, const TuneTable* table) noexcept {
  // Hard requirements: what the kernels can do at all.
  if (!caps.custom_available) return Choice{};
  if (caps.world_size < 2 || caps.world_size > 8) return Choice{};
  if (caps.max_blocks < 1) return Choice{};
  if (!custom_dtype(dtype) || op != ReduceOp::kSum) return Choice{};
  if (bytes <= 0 || bytes > caps.max_bytes) return Choice{};
  if (bytes % static_cast<std::int64_t>(dtype_size(dtype)) != 0) return Choice{};

  auto lamport_serves = [&](Algo a) {
    return dtype_size(dtype) == 2 &&
           lamport_fits(a, bytes, caps.world_size, caps.lamport_max_bytes);
  };
  auto fallback = [&] { return default_choice(bytes, caps.world_size, caps.max_blocks); };
  auto forced_lamport = [&](Algo a) {
    return lamport_serves(a) ? default_launch(a, bytes, caps.world_size, caps.max_blocks)
                             : fallback();
  };
  switch (forced) {
    case AlgoChoice::kNccl:
      return Choice{};
    case AlgoChoice::kOneShot:
      return default_launch(Algo::kOneShot, bytes, caps.world_size, caps.max_blocks);
    case AlgoChoice::kTwoShot:
      return default_launch(Algo::kTwoShot, bytes, caps.world_size, caps.max_blocks);
    case AlgoChoice::kLamport:
      return forced_lamport(Algo::kLamport);
    case AlgoChoice::kLamportTwoShot:
      return forced_lamport(Algo::kLamportTwoShot);
    case AlgoChoice::kAuto:
      break;
  }
  if (table != nullptr && table->key().world_size == caps.world_size) {
    if (auto tuned = table->lookup(bytes)) {
      if (is_lamport(tuned->algo) && !lamport_serves(tuned->algo)) return fallback();
      return clamp_blocks(*tuned, caps.max_blocks);
    }
  }
  const std::int64_t lamport_default =
      caps.world_size <= 4 ? kLamportMaxBytesUpTo4Ranks : kLamportMaxBytes;
  if (bytes <= lamport_default && lamport_serves(Algo::kLamport))
    return default_launch(Algo::kLamport, bytes, caps.world_size, caps.max_blocks);
  return fallback();
}

}  // namespace tpcomm
