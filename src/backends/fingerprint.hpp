// SPDX-License-Identifier: Apache-2.0
// What a collective call is, in 64 bits that every rank computes alike (NOTE [fingerprints] in
// kernels/common/sync.cuh).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backends/backend.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

/// The fingerprint of a call: bits 63..60 the operation (`Op` + 1, never 0), 59..56 the dtype,
/// 55..33 `shape` (23 bits of the operation's shape parameters: see `fused_shape`,
/// `shape_hash`), 32..0 the element count (modulo 2^33). `count` is what every rank passes alike:
/// the input's elements for the reductions and the all-gather, the elements every rank moves for
/// the all-to-all, the shard logits' for the LM head.
[[nodiscard]] std::uint64_t fingerprint(Op op, DType dtype, std::int64_t count,
                                        std::uint32_t shape = 0) noexcept;

/// The shape word of a fused all-reduce + residual add + RMSNorm: the epilogue (`kernels::Fusion`)
/// in bits 22..20, its form (`norm_form` in ops/fused_norm.hpp: no residual 1, f32 gamma 2, `1 +
/// gamma` 4) in bits 19..17, the hidden size below (modulo 2^17).
[[nodiscard]] std::uint32_t fused_shape(int fusion, int form, std::int64_t hidden) noexcept;

/// 23 bits of a hash (FNV-1a) of `values`: the shape word of the exchanges whose shape is more
/// than a count (the all-to-all's per-peer counts, the LM head's layout and columns).
[[nodiscard]] std::uint32_t shape_hash(std::span<const std::int64_t> values) noexcept;

/// The call a fingerprint stands for, as messages name it: "all_reduce 4096 bfloat16",
/// "all_reduce_add_rmsnorm 57344 bfloat16 (hidden 7168)", "all_to_all 8192 uint8 (shape
/// 0x03fa21)", "all_reduce_add_rmsnorm 1024 half (hidden 512, f8e4m3 out per group, no
/// residual, f32 gamma, 1 + gamma)", "gather 4096 bfloat16 (to rank 2)".
[[nodiscard]] std::string describe_fingerprint(std::uint64_t fingerprint);

/// The key of call number `call` (NOTE [fingerprints]): the call number times an odd constant,
/// in the low 32 bits, so that two call numbers less than 2^30 apart give keys that differ in the
/// low 30 bits, the bits of a barrier flag's hash and of a Lamport header that carry it.
[[nodiscard]] constexpr std::uint64_t call_key(std::uint32_t call) noexcept {
  return static_cast<std::uint32_t>(call * 0x9E3779B1u);
}

/// What the kernels of a call carry and compare (NOTE [fingerprints]): its fingerprint keyed by
/// its call number, so that ranks whose calls of the same shape are out of step differ too.
[[nodiscard]] constexpr std::uint64_t keyed_fingerprint(const CallTag& tag) noexcept {
  return tag.fingerprint ^ call_key(tag.call);
}

/// The fingerprint of call number `call` whose kernels carried `keyed` (a posted fingerprint).
[[nodiscard]] constexpr std::uint64_t unkeyed_fingerprint(std::uint64_t keyed,
                                                          std::uint32_t call) noexcept {
  return keyed ^ call_key(call);
}

}  // namespace tpcomm
