// SPDX-License-Identifier: Apache-2.0
// Exact test data: every element is a small integer chosen so that any reduction of up to 8
// ranks, in any order, is exactly representable in its type. Checks compare bit patterns, so
// a misplaced element, an unwritten one (poisoned) or a wrong sum never passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/test_data.hpp"

namespace tpcomm::kernels {
namespace {

__device__ __forceinline__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Value of element `index` on rank `rank`: in [-8, 8] for sums (so 8 ranks stay within
/// [-64, 64], exact even in bf16), {-2, -1, 1, 2} for products, narrower for fp8 and never
/// negative for unsigned types.
__device__ std::int64_t value_of(std::uint64_t seed, int rank, std::int64_t index, DType dtype,
                                 ReduceOp op) {
  const std::uint64_t h = mix(seed ^ mix(static_cast<std::uint64_t>(rank) * 0x100000001B3ull ^
                                         static_cast<std::uint64_t>(index)));
  const bool is_unsigned = dtype == DType::kU8 || dtype == DType::kU32 || dtype == DType::kU64;
  if (op == ReduceOp::kProd) {
    const std::int64_t m = (h & 1u) ? 2 : 1;
    return (!is_unsigned && (h & 2u)) ? -m : m;
  }
  std::int64_t range = 8;  // values in [-range, range]
  if (dtype == DType::kF8E4M3) range = 2;
  if (dtype == DType::kF8E5M2) range = 1;
  if (is_unsigned) return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(2 * range + 1));
  return static_cast<std::int64_t>(h % static_cast<std::uint64_t>(2 * range + 1)) - range;
}

__device__ std::int64_t combine(std::int64_t a, std::int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return a * b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    case ReduceOp::kMin:
      return a < b ? a : b;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      break;
  }
  return a + b;
}

/// Writes `v` as element `i` of a `dtype` array.
__device__ void store_as(void* p, std::int64_t i, DType dtype, double v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __double2half(v);
      break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v);
      break;
    case DType::kI8:
      static_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(v);
      break;
    case DType::kU8:
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(v);
      break;
    case DType::kI32:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      break;
    case DType::kU32:
      static_cast<std::uint32_t*>(p)[i] = static_cast<std::uint32_t>(v);
      break;
    case DType::kI64:
      static_cast<std::int64_t*>(p)[i] = static_cast<std::int64_t>(v);
      break;
    case DType::kU64:
      static_cast<std::uint64_t*>(p)[i] = static_cast<std::uint64_t>(v);
      break;
    case DType::kF8E4M3:
      static_cast<__nv_fp8_e4m3*>(p)[i] = __nv_fp8_e4m3(static_cast<float>(v));
      break;
    case DType::kF8E5M2:
      static_cast<__nv_fp8_e5m2*>(p)[i] = __nv_fp8_e5m2(static_cast<float>(v));
      break;
  }
}

/// Element `i` of a `dtype` array as a double (exact for every value the tests produce).
__device__ double load_as(const void* p, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(p)[i];
    case DType::kF64:
      return static_cast<const double*>(p)[i];
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kI8:
      return static_cast<const std::int8_t*>(p)[i];
    case DType::kU8:
      return static_cast<const std::uint8_t*>(p)[i];
    case DType::kI32:
      return static_cast<const std::int32_t*>(p)[i];
    case DType::kU32:
      return static_cast<const std::uint32_t*>(p)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const std::int64_t*>(p)[i]);
    case DType::kU64:
      return static_cast<double>(static_cast<const std::uint64_t*>(p)[i]);
    case DType::kF8E4M3:
      return static_cast<float>(static_cast<const __nv_fp8_e4m3*>(p)[i]);
    case DType::kF8E5M2:
      return static_cast<float>(static_cast<const __nv_fp8_e5m2*>(p)[i]);
  }
  return 0.0;
}

/// True when element `i` holds exactly the bits of `expected` converted to `dtype`.
__device__ bool equals_bitwise(const void* p, std::int64_t i, DType dtype, double expected) {
  const std::size_t w = dtype_size(dtype);
  unsigned char want[8] = {};
  store_as(want, 0, dtype, expected);
  const unsigned char* got =
      static_cast<const unsigned char*>(p) + i * static_cast<std::int64_t>(w);
  for (std::size_t b = 0; b < w; ++b)
    if (got[b] != want[b]) return false;
  return true;
}

__global__ void fill_kernel(void* data, DType dtype, std::int64_t count, std::uint64_t seed,
                            int rank, ReduceOp op, std::int64_t first) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    store_as(data, i, dtype, static_cast<double>(value_of(seed, rank, first + i, dtype, op)));
}

__global__ void check_kernel(const void* out, DType dtype, std::int64_t count, std::uint64_t seed,
                             int rank, int world, ReduceOp op, Collective coll, int root,
                             unsigned long long* wrong) {
  unsigned long long bad = 0;
  const std::int64_t per =
      coll == Collective::kAllGather || coll == Collective::kAllToAll ? count / world : count;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < count;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    double expected = 0;
    switch (coll) {
      case Collective::kAllReduce:
      case Collective::kReduceScatter: {
        const std::int64_t index = coll == Collective::kAllReduce ? j : rank * count + j;
        std::int64_t acc = value_of(seed, 0, index, dtype, op);
        for (int s = 1; s < world; ++s) acc = combine(acc, value_of(seed, s, index, dtype, op), op);
        expected =
            op == ReduceOp::kAvg ? static_cast<double>(acc) / world : static_cast<double>(acc);
        break;
      }
      case Collective::kAllGather:
        expected =
            static_cast<double>(value_of(seed, static_cast<int>(j / per), j % per, dtype, op));
        break;
      case Collective::kAllToAll:
        expected = static_cast<double>(
            value_of(seed, static_cast<int>(j / per), rank * per + j % per, dtype, op));
        break;
      case Collective::kBroadcast:
        expected = static_cast<double>(value_of(seed, root, j, dtype, op));
        break;
    }
    bool ok;
    if (op == ReduceOp::kAvg &&
        (coll == Collective::kAllReduce || coll == Collective::kReduceScatter)) {
      // An average divides by the world size, which is inexact for most sizes: allow the
      // rounding of one step of the output type.
      const double got = load_as(out, j, dtype);
      const double tol = dtype == DType::kBF16 ? 1.0 / 64 : dtype == DType::kF16 ? 1.0 / 512 : 1e-6;
      ok = got == got && fabs(got - expected) <= tol * (fabs(expected) + 1.0);
    } else {
      ok = equals_bitwise(out, j, dtype, expected);
    }
    bad += ok ? 0 : 1;
  }
  if (bad != 0) atomicAdd(wrong, bad);
}

__global__ void check_lm_head_kernel(const void* out, DType dtype, std::int64_t rows,
                                     std::int64_t vocab, std::int64_t cols, std::int64_t first,
                                     std::uint64_t seed, unsigned long long* wrong) {
  unsigned long long bad = 0;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       j < rows * vocab; j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = j / vocab;
    const std::int64_t v = j % vocab;
    const auto expected = static_cast<double>(value_of(
        seed, static_cast<int>(v / cols), (first + row) * cols + v % cols, dtype, ReduceOp::kSum));
    bad += equals_bitwise(out, j, dtype, expected) ? 0 : 1;
  }
  if (bad != 0) atomicAdd(wrong, bad);
}

__global__ void negate_kernel(void* data, DType dtype, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    store_as(data, i, dtype, -load_as(data, i, dtype));
}

__global__ void check_residual_norm_kernel(const void* residual, const void* norm, DType dtype,
                                           std::int64_t count, std::uint64_t seed, int world,
                                           int times, unsigned long long* wrong) {
  unsigned long long bad = 0;
  for (std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; j < count;
       j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t sum = 0;
    for (int s = 0; s < world; ++s) sum += value_of(seed, s, j, dtype, ReduceOp::kSum);
    const auto expected = static_cast<double>(sum * times);
    // x * rsqrt(...) * 0: a zero with the sign of x (the rsqrt is positive).
    bad += equals_bitwise(residual, j, dtype, expected) ? 0 : 1;
    bad += equals_bitwise(norm, j, dtype, expected < 0 ? -0.0 : 0.0) ? 0 : 1;
  }
  if (bad != 0) atomicAdd(wrong, bad);
}

__global__ void busy_kernel(std::uint64_t ns) {
  if (ns == 0) return;
  std::uint64_t start = 0;
  std::uint64_t now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace

Status fill_data(void* data, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                 ReduceOp op, std::int64_t first, Stream stream) noexcept {
  if (count <= 0) return Status::kOk;
  fill_kernel<<<grid_for(count), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      data, dtype, count, seed, rank, op, first);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status warm_up_test_data(Stream stream) noexcept {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  fill_kernel<<<1, 32, 0, s>>>(nullptr, DType::kF32, 0, 0, 0, ReduceOp::kSum, 0);
  check_kernel<<<1, 32, 0, s>>>(nullptr, DType::kF32, 0, 0, 0, 1, ReduceOp::kSum,
                                Collective::kAllReduce, 0, nullptr);
  check_lm_head_kernel<<<1, 32, 0, s>>>(nullptr, DType::kF32, 0, 1, 1, 0, 0, nullptr);
  negate_kernel<<<1, 32, 0, s>>>(nullptr, DType::kF32, 0);
  check_residual_norm_kernel<<<1, 32, 0, s>>>(nullptr, nullptr, DType::kF32, 0, 0, 1, 1, nullptr);
  busy_kernel<<<1, 32, 0, s>>>(0);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status poison(void* data, std::int64_t bytes, Stream stream) noexcept {
  if (bytes <= 0) return Status::kOk;
  return cudaMemsetAsync(data, 0xFF, static_cast<std::size_t>(bytes),
                         reinterpret_cast<cudaStream_t>(stream)) == cudaSuccess
             ? Status::kOk
             : Status::kCudaError;
}

Status check_data(const void* out, DType dtype, std::int64_t count, std::uint64_t seed, int rank,
                  int world_size, ReduceOp op, Collective collective, int root,
                  unsigned long long* wrong, Stream stream) noexcept {
  if (count <= 0) return Status::kOk;
  check_kernel<<<grid_for(count), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      out, dtype, count, seed, rank, world_size, op, collective, root, wrong);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status check_lm_head(const void* out, DType dtype, std::int64_t rows, std::int64_t vocab,
                     std::int64_t shard_cols, std::int64_t first, std::uint64_t seed,
                     unsigned long long* wrong, Stream stream) noexcept {
  if (rows <= 0 || vocab <= 0) return Status::kOk;
  if (shard_cols <= 0) return Status::kInvalidArgument;
  check_lm_head_kernel<<<grid_for(rows * vocab), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      out, dtype, rows, vocab, shard_cols, first, seed, wrong);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status negate_data(void* data, DType dtype, std::int64_t count, Stream stream) noexcept {
  if (dtype == DType::kU8 || dtype == DType::kU32 || dtype == DType::kU64)
    return Status::kInvalidArgument;
  if (count <= 0) return Status::kOk;
  negate_kernel<<<grid_for(count), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(data, dtype,
                                                                                     count);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status check_residual_norm(const void* residual, const void* norm, DType dtype, std::int64_t count,
                           std::uint64_t seed, int world_size, int times, unsigned long long* wrong,
                           Stream stream) noexcept {
  if (count <= 0) return Status::kOk;
  check_residual_norm_kernel<<<grid_for(count), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      residual, norm, dtype, count, seed, world_size, times, wrong);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status busy_wait(std::uint64_t ns, Stream stream) noexcept {
  busy_kernel<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(ns);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

}  // namespace tpcomm::kernels
