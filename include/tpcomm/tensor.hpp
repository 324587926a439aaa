// SPDX-License-Identifier: Apache-2.0
// A non-owning view of a device tensor: the argument type of every collective.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "tpcomm/types.hpp"

namespace tpcomm {

/// A non-owning, trivially copyable view of an N-d tensor in device memory.
///
/// Shape and strides are in **elements**, not bytes, as in PyTorch. At most `kMaxDims`
/// dimensions. A view with `ndim == 0` is a scalar (one element).
struct TensorView {
  static constexpr int kMaxDims = 6;

  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};
  /// CUDA device ordinal the memory lives on; -1 when unknown.
  int device = -1;

  /// A contiguous (row-major) view. Throws `Error(kInvalidArgument)` for more than `kMaxDims`
  /// dimensions or a negative extent.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               int device = -1);
  /// A contiguous 1-d view of `count` elements.
  static TensorView flat(void* data, DType dtype, std::int64_t count, int device = -1);

  /// Number of elements (product of the shape; 1 for a scalar).
  [[nodiscard]] std::int64_t numel() const noexcept;
  /// Bytes covered by the elements, `numel() * dtype_size(dtype)`.
  [[nodiscard]] std::int64_t nbytes() const noexcept;
  /// True when the strides are the row-major strides of the shape (extent-1 dimensions and
  /// empty tensors are contiguous whatever their strides).
  [[nodiscard]] bool is_contiguous() const noexcept;
  /// The view with its dimensions flattened to one, same data. Only meaningful when contiguous.
  [[nodiscard]] TensorView flattened() const noexcept;
  /// True when `data` is a multiple of `bytes` (a power of two).
  [[nodiscard]] bool is_aligned(std::int64_t bytes) const noexcept;
  /// True when both views have the same dtype and shape.
  [[nodiscard]] bool same_layout(const TensorView& other) const noexcept;
};

}  // namespace tpcomm
