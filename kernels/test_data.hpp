// SPDX-License-Identifier: Apache-2.0
// Exact test data for the tests, `tpcomm bench --check` and `tpcomm step`: fills, checks and a
// stand-in for compute. Built into `tpcomm_test_kernels`, which the tests and the program link;
// `libtpcomm` does not carry it.
#pragma once

#include <cstdint>

#include "tpcomm/status.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::kernels {

/// What the checked collective was, for `check_data`.
enum class Collective : std::uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast
};

/// Fills `count` elements with rank `rank`'s exact test values for `op` (small integers whose
/// every partial result is representable in `dtype`), starting at element index `first`.
Status fill_data(void* data, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                 ReduceOp op, std::int64_t first, Stream stream) noexcept;

/// Launches the test-data kernels once on `stream` with nothing to do. Ranks that share a process
/// call it on every stream before its first collective, as callers do for their own kernels
/// (NOTE [first launch] in backends/custom_ar.cpp; README, "Ranks that share a process").
Status warm_up_test_data(Stream stream) noexcept;

/// Sets every byte of `bytes` bytes to 0xFF (NaN in every float type) so that an element the
/// collective did not write cannot pass a check.
Status poison(void* data, std::int64_t bytes, Stream stream) noexcept;

/// Counts the elements of the LM-head exchange's output `out` ([rows, vocab] of `dtype`) that
/// differ bitwise from what it must hold when every rank r's [T, shard_cols] shard logits come
/// from `fill_data(seed, r)` (sum data) and this rank's rows start at row `first` of them, adding
/// the count to `*wrong` (device memory).
Status check_lm_head(const void* out, DType dtype, std::int64_t rows, std::int64_t vocab,
                     std::int64_t shard_cols, std::int64_t first, std::uint64_t seed,
                     unsigned long long* wrong, Stream stream) noexcept;

/// Negates `count` elements of `data` in place (exact for `fill_data` values; +0 becomes -0).
/// Signed and floating types only: kInvalidArgument for unsigned ones.
Status negate_data(void* data, DType dtype, std::int64_t count, Stream stream) noexcept;

/// Counts the elements of a chain of fused all-reduce + residual add + RMSNorm operations'
/// outputs that differ bitwise from what they must hold (`count` elements each), adding the count
/// to `*wrong` (device memory): `residual` must be `times` x the sum over `world_size` ranks of
/// `fill_data(seed, r)` sum data (a residual that started at zero), and `norm`, whose gamma was
/// zero, the zero of that value's sign.
Status check_residual_norm(const void* residual, const void* norm, DType dtype, std::int64_t count,
                           std::uint64_t seed, int world_size, int times, unsigned long long* wrong,
                           Stream stream) noexcept;

/// Keeps one block of the GPU busy for `ns` nanoseconds (by the global timer): a stand-in for
/// the compute between collectives. 0 returns at once (a warm-up launch).
Status busy_wait(std::uint64_t ns, Stream stream) noexcept;

/// Counts the elements of `out` that differ bitwise from what `collective` must produce on
/// rank `rank` of `world_size` from `fill_data` inputs (`count` = elements of `out`; `root` for
/// broadcast), adding the count to `*wrong` (device memory).
Status check_data(const void* out, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                  int world_size, ReduceOp op, Collective collective, int root,
                  unsigned long long* wrong, Stream stream) noexcept;

}  // namespace tpcomm::kernels
