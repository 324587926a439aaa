// SPDX-License-Identifier: Apache-2.0
// Element types, reduction operators, the stream alias and the tri-state `Switch`: the small
// vocabulary types that every public header may use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

/// The CUDA stream type without the CUDA headers: `cudaStream_t` is `CUstream_st*`.
struct CUstream_st;

namespace tpcomm {

/// A CUDA stream (`cudaStream_t`). `nullptr` is the legacy default stream.
using Stream = CUstream_st*;

/// Element type. The numbering is tpcomm's own; `to_nccl` style mappings live in the backends.
enum class DType : std::uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kU8,
  kI32,
  kU32,
  kI64,
  kU64,
  kF8E4M3,
  kF8E5M2,
};

/// Size of one element in bytes.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
      return 8;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      return 1;
  }
  return 0;
}

/// Name as nccl-tests prints it ("float", "half", "bfloat16", "int32", ...).
std::string_view to_string(DType t) noexcept;

/// Parses nccl-tests names and the short aliases f32, f16, bf16, fp8_e4m3, ...
std::optional<DType> parse_dtype(std::string_view name) noexcept;

/// Reduction operator.
enum class ReduceOp : std::uint8_t { kSum, kProd, kMax, kMin, kAvg };

/// "sum", "prod", "max", "min", "avg".
std::string_view to_string(ReduceOp op) noexcept;
std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept;

/// A user's setting for a feature that also has an automatic rule (tpcomm/policy.hpp), as a
/// knob (`Options`) or a flag of an inference engine carries it.
enum class Switch : std::uint8_t {
  /// Not set: the rule decides.
  kAuto,
  /// Forced on: the rule's conditions are not consulted.
  kOn,
  /// Forced off.
  kOff,
};

/// "auto", "on", "off".
std::string_view to_string(Switch s) noexcept;

}  // namespace tpcomm
