// SPDX-License-Identifier: Apache-2.0
// Whether two tensors share memory.
#pragma once

#include "tpcomm/tensor.hpp"

namespace tpcomm {

/// True when the byte ranges of `a` and `b` intersect (an empty or null view intersects
/// nothing).
[[nodiscard]] inline bool overlaps(const TensorView& a, const TensorView& b) noexcept {
  if (a.data == nullptr || b.data == nullptr || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.data);
  const auto* b0 = static_cast<const char*>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace tpcomm
