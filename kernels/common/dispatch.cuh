// SPDX-License-Identifier: Apache-2.0
// Run-time values to template parameters, in one place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/epilogue.cuh"
#include "kernels/kernels.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::kernels {

/// Launches `function` with the kernel argument `params` (copied) on `stream`, as a
/// programmatic dependent launch when `programmatic` (NOTE [programmatic launch]), in clusters of
/// `cluster` blocks when it is more than 1 (it divides `shape.blocks`).
template <class Params>
Status launch_with(const void* function, const Params& params, LaunchShape shape, bool programmatic,
                   Stream stream, int cluster = 1) noexcept {
  Params copy = params;
  void* args[] = {&copy};
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(shape.blocks);
  config.blockDim = dim3(shape.threads);
  config.stream = reinterpret_cast<cudaStream_t>(stream);
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelExC(&config, function, args) == cudaSuccess ? Status::kOk
                                                                     : Status::kCudaError;
}

/// Calls `f.template operator()<T>()` with the element type of `dtype` (f32, f16, bf16), or
/// returns kInvalidArgument.
template <class F>
Status dispatch_float_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      return f.template operator()<float>();
    case DType::kF16:
      return f.template operator()<__half>();
    case DType::kBF16:
      return f.template operator()<__nv_bfloat16>();
    default:
      return Status::kInvalidArgument;
  }
}

/// Calls `f.template operator()<R>()` for a world size 2..8, or returns kInvalidArgument.
template <class F>
Status dispatch_world_size(int world_size, F&& f) {
  switch (world_size) {
    case 2:
      return f.template operator()<2>();
    case 3:
      return f.template operator()<3>();
    case 4:
      return f.template operator()<4>();
    case 5:
      return f.template operator()<5>();
    case 6:
      return f.template operator()<6>();
    case 7:
      return f.template operator()<7>();
    case 8:
      return f.template operator()<8>();
    default:
      return Status::kInvalidArgument;
  }
}

/// `f.template operator()<K>()` with `fusion` as the template argument K (every `Fusion` value,
/// so that a new one needs no case here), or `none` for a value outside the enumeration.
template <class Result, class F>
Result dispatch_fusion_kind(Fusion fusion, Result none, F&& f) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    Result out = none;
    (void)((static_cast<Fusion>(I) == fusion &&
            (out = f.template operator()<static_cast<Fusion>(I)>(), true)) ||
           ...);
    return out;
  }
  (std::make_integer_sequence<int, kFusionCount>{});
}

/// Calls `f.template operator()<E>()` with the epilogue type of `fusion` among those the
/// all-reduce kernels carry (`on_lamport`): `Identity` for the plain all-reduce, `Fused<K>`
/// otherwise; or returns nullptr.
template <class F>
const void* dispatch_fusion(Fusion fusion, F&& f) {
  return dispatch_fusion_kind(fusion, static_cast<const void*>(nullptr),
                              [&]<Fusion K>() -> const void* {
                                if constexpr (K == Fusion::kNone)
                                  return f.template operator()<Identity>();
                                else if constexpr (on_lamport(K))
                                  return f.template operator()<Fused<K>>();
                                else
                                  return nullptr;
                              });
}

/// `f.template operator()<T, R, E>()` for the element type of `dtype`, a world size 2..8 and
/// the epilogue of `fusion`, or nullptr where there is none.
template <class F>
const void* find_instance(DType dtype, int world_size, Fusion fusion, F&& f) noexcept {
  const void* out = nullptr;
  (void)dispatch_float_dtype(dtype, [&]<class T>() {
    return dispatch_world_size(world_size, [&]<int R>() {
      out = dispatch_fusion(fusion, [&]<class E>() { return f.template operator()<T, R, E>(); });
      return Status::kOk;
    });
  });
  return out;
}

}  // namespace tpcomm::kernels
