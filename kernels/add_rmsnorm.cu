// SPDX-License-Identifier: Apache-2.0
// The local residual add + RMSNorm (+ FP8): the fused operation's epilogues (NOTE [epilogues] in
// kernels/common/epilogue.cuh) over a sum already reduced, for where no Lamport kernel serves it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "kernels/common/dispatch.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/kernels.hpp"
#include "kernels/launch_error.hpp"

namespace tpcomm::kernels {
namespace {

template <class T, Fusion K>
__global__ void __launch_bounds__(kFusedMaxThreads)
    add_rmsnorm_kernel(const T* sum, T* out, FusionParams fusion, std::int64_t count) {
  if (count == 0) return;  // a warm-up launch (NOTE [first launch])
  const Fused<K> epilogue(fusion, count);
  const bool sum_aligned = is_aligned16(sum);
  if constexpr (Fused<K>::kRows) {
    finish_rows<T, /*kBareSums=*/true>(epilogue, out, count, /*early_launch=*/false,
                                       [&](std::int64_t v, Pack<T>& x) {
                                         x = load_pack(sum, v, count, sum_aligned);
                                         return true;
                                       });
  } else {
    const std::int64_t packs = (count + Pack<T>::kElems - 1) / Pack<T>::kElems;
    const bool out_aligned = is_aligned16(out);
    for (std::int64_t v = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         v < packs; v += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      store_pack(out, v, count, out_aligned,
                 epilogue(load_pack(sum, v, count, sum_aligned), v * Pack<T>::kElems));
    }
  }
}

}  // namespace

Status launch_add_rmsnorm(const void* sum, void* residual_out, const FusionParams& fusion,
                          std::int64_t count, DType dtype, Stream stream) noexcept {
  if (count < 0 || (count > 0 && (fusion.hidden < 1 || count % fusion.hidden != 0 ||
                                  (traits(fusion.kind).quant == Quant::kFp8Group &&
                                   fusion.hidden % kFp8Group != 0))))
    return Status::kInvalidArgument;
  return dispatch_float_dtype(dtype, [&]<class T>() {
    return dispatch_fusion_kind(fusion.kind, Status::kInvalidArgument, [&]<Fusion K>() {
      if constexpr (K == Fusion::kNone || traits(K).combine) {
        return Status::kInvalidArgument;  // nothing to do locally, or a prologue to push
      } else {
        constexpr int W = Pack<T>::kElems;
        int blocks = 1;
        int threads = 256;
        if constexpr (traits(K).rows()) {
          // One block per row, about one pack per thread.
          const std::int64_t packs = (std::max<std::int64_t>(fusion.hidden, 1) + W - 1) / W + 1;
          threads = 64;
          while (threads < kFusedMaxThreads && threads < packs) threads *= 2;
          blocks = static_cast<int>(std::clamp<std::int64_t>(
              count / std::max<std::int64_t>(fusion.hidden, 1), 1, 1 << 20));
        } else {
          blocks = static_cast<int>(std::clamp<std::int64_t>((count / W + 256) / 256, 1, 1024));
        }
        add_rmsnorm_kernel<T, K><<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
            static_cast<const T*>(sum), static_cast<T*>(residual_out), fusion, count);
        return launched(cudaGetLastError());
      }
    });
  });
}

namespace {
thread_local char g_launch_error[256];  // NOLINT: this thread's, written only by `launched`
}  // namespace

Status launched(cudaError_t error) noexcept {
  if (error == cudaSuccess) return Status::kOk;
  std::snprintf(g_launch_error, sizeof(g_launch_error), "%s: %s", cudaGetErrorName(error),
                cudaGetErrorString(error));
  return Status::kCudaError;
}

const char* last_launch_error() noexcept { return g_launch_error; }

}  // namespace tpcomm::kernels
