// SPDX-License-Identifier: Apache-2.0
#include "backends/fingerprint.hpp"

#include <cstdio>

#include "core/log.hpp"

namespace tpcomm {
namespace {

constexpr int kOpShift = 60;
constexpr int kDTypeShift = 56;
constexpr int kShapeShift = 36;
constexpr std::uint64_t kShapeMask = (std::uint64_t{1} << 20) - 1;
constexpr std::uint64_t kCountMask = (std::uint64_t{1} << kShapeShift) - 1;
constexpr int kHiddenBits = 17;

}  // namespace

std::uint64_t fingerprint(Op op, DType dtype, std::int64_t count, std::uint32_t shape) noexcept {
  return (static_cast<std::uint64_t>(op) + 1) << kOpShift |
         (static_cast<std::uint64_t>(dtype) & 0xF) << kDTypeShift |
         (shape & kShapeMask) << kShapeShift | (static_cast<std::uint64_t>(count) & kCountMask);
}

std::uint32_t fused_shape(int fusion, std::int64_t hidden) noexcept {
  return static_cast<std::uint32_t>(fusion & 0x7) << kHiddenBits |
         static_cast<std::uint32_t>(hidden & ((1 << kHiddenBits) - 1));
}

std::uint32_t shape_hash(std::span<const std::int64_t> values) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int64_t v : values) {
    for (int b = 0; b < 8; ++b) {
      h ^= static_cast<std::uint64_t>(v) >> (8 * b) & 0xFF;
      h *= 0x100000001b3ull;
    }
  }
  return static_cast<std::uint32_t>((h ^ h >> 20 ^ h >> 40) & kShapeMask);
}

std::string describe_fingerprint(std::uint64_t fp) {
  const auto op_code = static_cast<int>(fp >> kOpShift);
  if (fp == 0 || op_code > static_cast<int>(Op::kLmHeadExchange) + 1) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(fp));
    return detail::concat("an operation of unknown fingerprint ", hex);
  }
  const auto op = static_cast<Op>(op_code - 1);
  const auto dtype = static_cast<DType>(fp >> kDTypeShift & 0xF);
  const auto shape = static_cast<std::uint32_t>(fp >> kShapeShift & kShapeMask);
  std::string text = detail::concat(to_string(op), " ", fp & kCountMask, " ", to_string(dtype));
  if (op == Op::kAllReduceAddRmsNorm) {
    const auto hidden = shape & ((1u << kHiddenBits) - 1);
    const auto fusion = shape >> kHiddenBits;
    const bool fp8 =
        kernels::traits(static_cast<kernels::Fusion>(fusion)).quant != kernels::Quant::kNone;
    text += detail::concat(" (hidden ", hidden, fp8 ? ", f8e4m3 out" : "", ")");
  } else if (shape != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%05x", shape);
    text += detail::concat(" (shape ", hex, ")");
  }
  return text;
}

}  // namespace tpcomm
