// SPDX-License-Identifier: Apache-2.0
// Names of the public enums and the TensorView arithmetic.
#include <algorithm>
#include <array>
#include <utility>

#include "core/check.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

std::string_view to_string(Status s) noexcept {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kUnsupported:
      return "unsupported";
    case Status::kInvalidArgument:
      return "invalid argument";
    case Status::kCudaError:
      return "CUDA error";
    case Status::kNcclError:
      return "NCCL error";
    case Status::kTimeout:
      return "timeout";
    case Status::kAborted:
      return "aborted";
    case Status::kUnavailable:
      return "unavailable";
    case Status::kSystemError:
      return "system error";
    case Status::kProtocolError:
      return "protocol error";
    case Status::kInternal:
      return "internal error";
    case Status::kMismatch:
      return "mismatch";
  }
  return "unknown status";
}

namespace {

struct DTypeName {
  DType type;
  std::string_view name;  // nccl-tests spelling first, then aliases
};

constexpr std::array kDTypeNames{
    DTypeName{DType::kF32, "float"},       DTypeName{DType::kF16, "half"},
    DTypeName{DType::kBF16, "bfloat16"},   DTypeName{DType::kF64, "double"},
    DTypeName{DType::kI8, "int8"},         DTypeName{DType::kU8, "uint8"},
    DTypeName{DType::kI32, "int32"},       DTypeName{DType::kU32, "uint32"},
    DTypeName{DType::kI64, "int64"},       DTypeName{DType::kU64, "uint64"},
    DTypeName{DType::kF8E4M3, "f8e4m3"},   DTypeName{DType::kF8E5M2, "f8e5m2"},
    DTypeName{DType::kF32, "f32"},         DTypeName{DType::kF32, "fp32"},
    DTypeName{DType::kF32, "float32"},     DTypeName{DType::kF16, "f16"},
    DTypeName{DType::kF16, "fp16"},        DTypeName{DType::kF16, "float16"},
    DTypeName{DType::kBF16, "bf16"},       DTypeName{DType::kF64, "f64"},
    DTypeName{DType::kF64, "fp64"},        DTypeName{DType::kF8E4M3, "fp8_e4m3"},
    DTypeName{DType::kF8E5M2, "fp8_e5m2"},
};

constexpr std::array<std::pair<ReduceOp, std::string_view>, 5> kReduceOpNames{{
    {ReduceOp::kSum, "sum"},
    {ReduceOp::kProd, "prod"},
    {ReduceOp::kMax, "max"},
    {ReduceOp::kMin, "min"},
    {ReduceOp::kAvg, "avg"},
}};

}  // namespace

std::string_view to_string(DType t) noexcept {
  for (const auto& n : kDTypeNames)
    if (n.type == t) return n.name;
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (const auto& n : kDTypeNames)
    if (n.name == name) return n.type;
  return std::nullopt;
}

std::string_view to_string(ReduceOp op) noexcept {
  for (const auto& [o, n] : kReduceOpNames)
    if (o == op) return n;
  return "unknown";
}

std::optional<ReduceOp> parse_reduce_op(std::string_view name) noexcept {
  for (const auto& [o, n] : kReduceOpNames)
    if (n == name) return o;
  return std::nullopt;
}

std::string_view to_string(Switch s) noexcept {
  switch (s) {
    case Switch::kAuto:
      return "auto";
    case Switch::kOn:
      return "on";
    case Switch::kOff:
      return "off";
  }
  return "unknown";
}

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, int device) {
  TPCOMM_CHECK(shape.size() <= static_cast<std::size_t>(kMaxDims), Status::kInvalidArgument,
               "TensorView: ", shape.size(), " dimensions, at most ", kMaxDims, " supported");
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.ndim = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), v.shape.begin());
  std::int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    TPCOMM_CHECK(v.shape[d] >= 0, Status::kInvalidArgument, "TensorView: negative extent ",
                 v.shape[d], " in dimension ", d);
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

TensorView TensorView::flat(void* data, DType dtype, std::int64_t count, int device) {
  return contiguous(data, dtype, {count}, device);
}

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

std::int64_t TensorView::nbytes() const noexcept {
  return numel() * static_cast<std::int64_t>(dtype_size(dtype));
}

bool TensorView::is_contiguous() const noexcept {
  if (numel() == 0) return true;
  std::int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

TensorView TensorView::flattened() const noexcept {
  TensorView v = *this;
  v.ndim = 1;
  v.shape = {};
  v.strides = {};
  v.shape[0] = numel();
  v.strides[0] = 1;
  return v;
}

bool TensorView::is_aligned(std::int64_t bytes) const noexcept {
  return (reinterpret_cast<std::uintptr_t>(data) & static_cast<std::uintptr_t>(bytes - 1)) == 0;
}

bool TensorView::same_layout(const TensorView& other) const noexcept {
  if (dtype != other.dtype || ndim != other.ndim) return false;
  for (int d = 0; d < ndim; ++d)
    if (shape[d] != other.shape[d]) return false;
  return true;
}

}  // namespace tpcomm
