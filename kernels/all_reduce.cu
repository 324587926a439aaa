// SPDX-License-Identifier: Apache-2.0
// Launchers of the custom all-reduce kernels: the one place where they are instantiated.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/all_reduce_lamport.cuh"
#include "kernels/all_reduce_lamport_two_shot.cuh"
#include "kernels/all_reduce_one_shot.cuh"
#include "kernels/all_reduce_two_shot.cuh"
#include "kernels/common/dispatch.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {
namespace {

/// The kernel function of (algo, T, R).
template <class T, int R>
const void* kernel_of(Algo algo) {
  switch (algo) {
    case Algo::kOneShot:
      return reinterpret_cast<const void*>(&all_reduce_one_shot_kernel<T, R>);
    case Algo::kTwoShot:
      return reinterpret_cast<const void*>(&all_reduce_two_shot_kernel<T, R>);
    case Algo::kLamport:
      if constexpr (sizeof(T) == 2)
        return reinterpret_cast<const void*>(&all_reduce_lamport_kernel<T, R>);
      break;
    case Algo::kLamportTwoShot:
      if constexpr (sizeof(T) == 2)
        return reinterpret_cast<const void*>(&all_reduce_lamport_two_shot_kernel<T, R>);
      break;
    case Algo::kNone:
      break;
  }
  return nullptr;
}

Status find_kernel(Algo algo, DType dtype, int world_size, const void** out) {
  return dispatch_float_dtype(dtype, [&]<class T>() {
    return dispatch_world_size(world_size, [&]<int R>() {
      *out = kernel_of<T, R>(algo);
      return *out != nullptr ? Status::kOk : Status::kInvalidArgument;
    });
  });
}

}  // namespace

Status launch_all_reduce(const AllReduceParams& params, Choice choice, bool programmatic,
                         Stream stream) noexcept {
  if (choice.blocks < 1 || choice.blocks > kMaxBlocks || choice.threads < 32 ||
      choice.threads > 1024 || choice.threads % 32 != 0 || choice.threads < params.world_size)
    return Status::kInvalidArgument;
  const std::int64_t bytes = params.count * static_cast<std::int64_t>(dtype_size(params.dtype));
  if (is_lamport(choice.algo) &&
      !lamport_fits(choice.algo, bytes, params.world_size, params.layout.lamport_slot_bytes))
    return Status::kInvalidArgument;
  const void* kernel = nullptr;
  if (Status s = find_kernel(choice.algo, params.dtype, params.world_size, &kernel);
      s != Status::kOk)
    return s;
  AllReduceParams copy = params;
  void* args[] = {&copy};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(choice.blocks);
  config.blockDim = dim3(choice.threads);
  config.stream = reinterpret_cast<cudaStream_t>(stream);
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  cudaError_t e = cudaLaunchKernelExC(&config, kernel, args);
  return e == cudaSuccess ? Status::kOk : Status::kCudaError;
}

Status warm_up(int world_size, Stream stream) noexcept {
  AllReduceParams empty{};  // count 0: every kernel returns at once
  empty.world_size = world_size;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    empty.dtype = t;
    for (Algo a : {Algo::kOneShot, Algo::kTwoShot, Algo::kLamport, Algo::kLamportTwoShot}) {
      if (is_lamport(a) && t == DType::kF32) continue;  // 16-bit types only
      if (Status s = launch_all_reduce(empty, Choice{a, 1, 32}, false, stream); s != Status::kOk)
        return s;
    }
  }
  if (Status s = fill_lamport_empty(nullptr, 0, stream); s != Status::kOk) return s;
  return warm_up_test_data(stream);
}

int max_blocks_per_sm(Algo algo, DType dtype, int world_size, int threads) noexcept {
  const void* kernel = nullptr;
  if (find_kernel(algo, dtype, world_size, &kernel) != Status::kOk) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess)
    return 0;
  return blocks;
}

namespace {

__global__ void fill_lamport_empty_kernel(uint4* p, std::int64_t packs) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < packs;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = lamport_empty_pack();
}

}  // namespace

Status fill_lamport_empty(void* buffers, std::int64_t bytes, Stream stream) noexcept {
  if (bytes % 16 != 0 || (reinterpret_cast<std::uintptr_t>(buffers) & 15u) != 0)
    return Status::kInvalidArgument;
  const std::int64_t packs = bytes / 16;  // 0: a warm-up launch
  const int blocks = static_cast<int>(std::clamp<std::int64_t>((packs + 255) / 256, 1, 1024));
  fill_lamport_empty_kernel<<<blocks, 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<uint4*>(buffers), packs);
  return cudaGetLastError() == cudaSuccess ? Status::kOk : Status::kCudaError;
}

}  // namespace tpcomm::kernels
