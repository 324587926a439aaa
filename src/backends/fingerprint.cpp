// SPDX-License-Identifier: Apache-2.0
#include "backends/fingerprint.hpp"

#include <cstdio>

#include "core/log.hpp"

namespace tpcomm {
namespace {

constexpr int kOpShift = 60;
constexpr int kDTypeShift = 56;
constexpr int kShapeShift = 33;
constexpr std::uint64_t kShapeMask = (std::uint64_t{1} << 23) - 1;
constexpr std::uint64_t kCountMask = (std::uint64_t{1} << kShapeShift) - 1;
constexpr int kHiddenBits = 17;
// The operation's 4 bits hold `Op` + 1.
static_assert(kOpCount < 16, "the fingerprint has 4 bits for the operation");

}  // namespace

std::uint64_t fingerprint(Op op, DType dtype, std::int64_t count, std::uint32_t shape) noexcept {
  return (static_cast<std::uint64_t>(op) + 1) << kOpShift |
         (static_cast<std::uint64_t>(dtype) & 0xF) << kDTypeShift |
         (shape & kShapeMask) << kShapeShift | (static_cast<std::uint64_t>(count) & kCountMask);
}

std::uint32_t fused_shape(int fusion, int form, std::int64_t hidden) noexcept {
  return static_cast<std::uint32_t>(fusion & 0x7) << (kHiddenBits + 3) |
         static_cast<std::uint32_t>(form & 0x7) << kHiddenBits |
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
  if (fp == 0 || op_code > static_cast<int>(kOpCount)) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%016llx", static_cast<unsigned long long>(fp));
    return detail::concat("an operation of unknown fingerprint ", hex);
  }
  const auto op = static_cast<Op>(op_code - 1);
  const auto dtype = static_cast<DType>(fp >> kDTypeShift & 0xF);
  const auto shape = static_cast<std::uint32_t>(fp >> kShapeShift & kShapeMask);
  std::string text = detail::concat(to_string(op), " ", fp & kCountMask, " ", to_string(dtype));
  if (row(op).word == OpWord::kFused) {
    const auto hidden = shape & ((1u << kHiddenBits) - 1);
    const auto form = shape >> kHiddenBits & 0x7;
    const kernels::Quant quant =
        kernels::traits(static_cast<kernels::Fusion>(shape >> (kHiddenBits + 3))).quant;
    const char* out = quant == kernels::Quant::kFp8        ? ", f8e4m3 out"
                      : quant == kernels::Quant::kFp8Token ? ", f8e4m3 out per row"
                      : quant == kernels::Quant::kFp8Group ? ", f8e4m3 out per group"
                                                           : "";
    text += detail::concat(" (hidden ", hidden, out, (form & 1) != 0 ? ", no residual" : "",
                           (form & 2) != 0 ? ", f32 gamma" : "",
                           (form & 4) != 0 ? ", 1 + gamma" : "", ")");
  } else if (row(op).word == OpWord::kRoot) {
    text += detail::concat(" (to rank ", shape, ")");
  } else if (shape != 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%06x", shape);
    text += detail::concat(" (shape ", hex, ")");
  }
  return text;
}

}  // namespace tpcomm
