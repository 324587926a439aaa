// SPDX-License-Identifier: Apache-2.0
// Launchers of the custom all-reduce kernels: the one place where they are instantiated.
#include <cuda_runtime.h>

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

Status preload_all_reduce(int world_size) noexcept {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Algo a : {Algo::kOneShot, Algo::kTwoShot}) {
      const void* kernel = nullptr;
      if (Status s = find_kernel(a, t, world_size, &kernel); s != Status::kOk) return s;
      cudaFuncAttributes attributes{};
      if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) return Status::kCudaError;
    }
  }
  return Status::kOk;
}

int max_blocks_per_sm(Algo algo, DType dtype, int world_size, int threads) noexcept {
  const void* kernel = nullptr;
  if (find_kernel(algo, dtype, world_size, &kernel) != Status::kOk) return 0;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0) != cudaSuccess)
    return 0;
  return blocks;
}

}  // namespace tpcomm::kernels
