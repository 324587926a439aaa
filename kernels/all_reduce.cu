// SPDX-License-Identifier: Apache-2.0
// The launcher of the all-reduce kernels (each kernel is instantiated in its own file, and the
// registry of algorithms names it), and the Lamport buffers' fill.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/common/dispatch.cuh"
#include "kernels/common/lamport.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

Status launch_all_reduce(const AllReduceParams& params, const AllReduceKernel& kernel,
                         LaunchShape shape, bool programmatic, Stream stream) noexcept {
  if (shape.blocks < 1 || shape.blocks > kMaxBlocks || shape.threads < 32 ||
      shape.threads > max_threads(kernel) || shape.threads % 32 != 0 ||
      shape.threads < params.world_size || !is_valid_group(shape.group, shape.blocks))
    return Status::kInvalidArgument;
  const std::int64_t bytes = params.count * static_cast<std::int64_t>(dtype_size(params.dtype));
  if (lamport_slot_need(kernel, bytes, params.world_size) > params.layout.lamport_slot_bytes)
    return Status::kInvalidArgument;
  const FusionParams& fusion = params.fusion;
  if (fusion.kind != Fusion::kNone &&
      (fusion.hidden < 1 || params.count % fusion.hidden != 0 || shape.threads > kFusedMaxThreads ||
       (traits(fusion.kind).quant == Quant::kFp8Group && fusion.hidden % kFp8Group != 0)))
    return Status::kInvalidArgument;
  // NOTE [scattered rows]: each slice is whole rows, starting on a pack boundary.
  if (params.scattered && (!scatters(kernel) || !traits(fusion.kind).rows() ||
                           params.count % (std::int64_t{params.world_size} * fusion.hidden) != 0 ||
                           bytes / params.world_size % 16 != 0))
    return Status::kInvalidArgument;
  const void* function = kernel_function(kernel, params.dtype, params.world_size, fusion.kind);
  if (function == nullptr) return Status::kInvalidArgument;
  // NOTE [row groups]: only a row step shares rows among blocks.
  const int group = traits(fusion.kind).rows() ? shape.group : 1;
  return launch_with(function, params, shape, programmatic, stream, group);
}

int max_blocks_per_sm(const AllReduceKernel& kernel, DType dtype, int world_size, int threads,
                      Fusion fusion) noexcept {
  const void* function = kernel_function(kernel, dtype, world_size, fusion);
  int blocks = 0;
  if (function == nullptr ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, threads, 0) != cudaSuccess)
    return 0;
  return blocks;
}

int max_active_clusters(const AllReduceKernel& kernel, DType dtype, int world_size, int threads,
                        Fusion fusion, int cluster) noexcept {
  const void* function = kernel_function(kernel, dtype, world_size, fusion);
  if (function == nullptr || cluster < 1) return 0;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, function, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
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
