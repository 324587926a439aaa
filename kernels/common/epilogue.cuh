// SPDX-License-Identifier: Apache-2.0
// The epilogue slot of the all-reduce kernels.
#pragma once

#include <cstdint>

#include "kernels/common/vec.cuh"
#include "kernels/kernels.hpp"

namespace tpcomm::kernels {

// NOTE [epilogues]
// Every all-reduce kernel is a template over an epilogue, which sees each reduced pack before it
// is stored (one-shot and Lamport: before the output store; two-shots: where the owner of a
// slice finishes it, before it is shared) and returns what to store. This is how fused
// operations (residual add, RMSNorm, quantisation) ride on the same kernels instead of copies of
// them. An epilogue is a trivially copyable type constructed on the device from the kernel's
// `AllReduceParams` (where its own arguments will live), with
//
//   template <class T>
//   __device__ Pack<T> operator()(const Pack<T>& sum, std::int64_t first) const;
//
// where `first` is the index in the message of the pack's first element, so that an epilogue
// over rows of `n` elements finds its row as `first / n`. `Identity` stores the sum as it is and
// compiles to nothing: the kernels with it are the plain all-reduce (measured before and after
// in docs/PERFORMANCE.md).
struct Identity {
  __device__ explicit Identity(const AllReduceParams& /*params*/) {}

  template <class T>
  __device__ __forceinline__ Pack<T> operator()(const Pack<T>& sum, std::int64_t /*first*/) const {
    return sum;
  }
};

}  // namespace tpcomm::kernels
