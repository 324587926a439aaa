// SPDX-License-Identifier: Apache-2.0
// The MoE layer's combine (`launch_moe_combine` in kernels/kernels.hpp): each token's top-k expert
// outputs weighted by the router, plus the shared expert's output, before the layer's
// all-reduce + residual add + RMSNorm.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/dispatch.cuh"
#include "kernels/common/vec.cuh"
#include "kernels/kernels.hpp"
#include "kernels/launch_error.hpp"

namespace tpcomm::kernels {
namespace {

// NOTE [moe combine]
// One block per token and slice of the row, one element per thread (at decode a few tokens must
// still spread over many blocks: one block per token left 7168 elements of one token to 256
// threads). A block's threads first read the token's top-k map entries and weights into shared
// memory (weights as f32), then each element of the slice is
// `sum over k (ascending) of weight_k * expert_k`, each product and sum in f32 (fmaf), then `+
// shared` in f32, rounded once into the activation dtype. A map entry outside the experts' rows
// is a caller's error that must not pass as a value: the token's whole row is NaN.

template <class T, bool WeightsF32>
__global__ void __launch_bounds__(256) moe_combine_kernel(MoeCombineParams p) {
  if (p.tokens == 0) return;  // a warm-up launch (NOTE [first launch])
  __shared__ std::int64_t rows[kMoeMaxTopK];
  __shared__ float weights[kMoeMaxTopK];
  __shared__ int bad;
  const std::int64_t t = blockIdx.x;
  const std::int64_t h = std::int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  for (int k = threadIdx.x; k < p.top_k; k += blockDim.x) {
    const std::int64_t i = t * p.top_k + k;
    const std::int32_t row = p.map[i];
    if (row < 0 || row >= p.rows) bad = 1;
    rows[k] = row;
    weights[k] = WeightsF32 ? static_cast<const float*>(p.weights)[i]
                            : to_float(static_cast<const T*>(p.weights)[i]);
  }
  __syncthreads();
  const T* experts = static_cast<const T*>(p.experts);
  const T* shared = static_cast<const T*>(p.shared);
  T* out = static_cast<T*>(p.out) + t * p.hidden;
  if (h >= p.hidden) return;
  float acc = 0.0f;
  if (bad) {
    acc = NAN;
  } else {
    for (int k = 0; k < p.top_k; ++k)
      acc = fmaf(weights[k], to_float(experts[rows[k] * p.hidden + h]), acc);
    if (shared != nullptr) acc += to_float(shared[t * p.hidden + h]);
  }
  out[h] = from_float<T>(acc);
}

}  // namespace

Status launch_moe_combine(const MoeCombineParams& p, DType dtype, Stream stream) noexcept {
  if (p.tokens < 0 || p.rows < 0 || p.hidden < 0 || p.hidden > kMoeMaxHidden || p.top_k < 1 ||
      p.top_k > kMoeMaxTopK || p.tokens > (std::int64_t{1} << 31) - 1)
    return Status::kInvalidArgument;
  return dispatch_float_dtype(dtype, [&]<class T>() {
    const int threads = p.hidden >= 2048 ? 256 : 128;
    const dim3 blocks(
        static_cast<unsigned>(std::max<std::int64_t>(p.tokens, 1)),
        static_cast<unsigned>(std::max<std::int64_t>((p.hidden + threads - 1) / threads, 1)));
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    if (p.weights_f32)
      moe_combine_kernel<T, true><<<blocks, threads, 0, s>>>(p);
    else
      moe_combine_kernel<T, false><<<blocks, threads, 0, s>>>(p);
    return launched(cudaGetLastError());
  });
}

}  // namespace tpcomm::kernels
