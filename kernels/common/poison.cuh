// SPDX-License-Identifier: Apache-2.0
// What a kernel that gives up leaves in its outputs (NOTE [poisoned outputs]).
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

// NOTE [poisoned outputs]
// A kernel that cannot complete its operation (a wait gave up, a peer's fingerprint differed, or
// its rank had already failed: NOTE [bounded waits]) must not leave outputs that look like a
// result, since a CUDA graph goes on replaying it and the caller may read them before anyone reads
// the error. So every block that gives up fills every output of the operation with its poison
// (`poison_pattern` in kernels/kernels.hpp): all-one bytes, which are NaN in every floating type
// (f32, f16, bf16, f8e4m3, f8e5m2, f64) and the largest value in unsigned integers, and the most
// negative value in signed integers, where all-one bytes would read as -1, the "none" of token
// and expert ids (documented in the README). Only the exchanges move integers, so only they take
// the pattern of their elements' type (`ExchangeParams::poison`). Each such block fills the
// whole of each output, not only its share: blocks of the same launch that completed wrote exact
// values, and element stores never tear (every store here and in the kernels is of whole,
// naturally aligned elements or 16-byte packs of them), so each element ends either exact or
// poisoned, never a mixture. Only the failure path pays for it.

/// Fills `bytes` bytes at `out` (aligned to `elem`, which divides 16 and `bytes`) with all-one
/// bytes, in stores of whole elements of `elem` bytes, or of 16-byte packs where `out` and
/// `bytes` allow; every thread of the block calls it. Kept small: it is inlined at every place a
/// kernel gives up (a call would give every kernel a stack frame).
__device__ __forceinline__ void poison_block(void* out, std::int64_t bytes, int elem) {
  if (out == nullptr || bytes <= 0) return;
  auto* p = static_cast<char*>(out);
  const bool packs =
      (reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(bytes)) % 16 == 0;
  const int step = packs ? 16 : elem;
  for (std::int64_t at = threadIdx.x * step; at < bytes; at += blockDim.x * step) {
    if (packs) {
      *reinterpret_cast<uint4*>(p + at) = make_uint4(~0u, ~0u, ~0u, ~0u);
    } else if (step == 8) {
      *reinterpret_cast<std::uint64_t*>(p + at) = ~std::uint64_t{0};
    } else if (step == 4) {
      *reinterpret_cast<std::uint32_t*>(p + at) = ~0u;
    } else if (step == 2) {
      *reinterpret_cast<std::uint16_t*>(p + at) = 0xFFFFu;
    } else {
      p[at] = static_cast<char>(0xFF);
    }
  }
}

/// Poisons every output of an all-reduce kernel over elements of type `T`: the sum (or
/// residual_out), and with a fused epilogue the normalised rows and the per-row scales; of this
/// rank's rows alone where the call is `scattered`.
template <class T>
__device__ __forceinline__ void poison_outputs_block(const AllReduceParams& p) {
  const std::int64_t count = p.scattered ? p.count / p.world_size : p.count;
  poison_block(p.output, count * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
  const FusionParams& f = p.fusion;
  if (f.kind == Fusion::kNone) return;
  const FusionTraits t = traits(f.kind);
  if (t.rows() && f.norm_out != p.output) {
    const int elem = t.quant == Quant::kNone ? static_cast<int>(sizeof(T)) : 1;
    poison_block(f.norm_out, count * elem, elem);
  }
  if (t.quant == Quant::kFp8Token && f.hidden > 0)
    poison_block(f.row_scales, count / f.hidden * 4, 4);
  if (t.quant == Quant::kFp8Group) poison_block(f.row_scales, count / kFp8Group * 4, 4);
}

}  // namespace tpcomm::kernels
