// SPDX-License-Identifier: Apache-2.0
// TPCOMM_HOST_DEVICE marks the kernels' functions that host code runs too, so that the cpu tier
// can run the arithmetic and the data layout a kernel runs (with nvcc: inlined into both; with a
// host compiler: an inline function). TPCOMM_UNROLL is `#pragma unroll` where nvcc compiles for
// the device, and nothing for the host (whose compiler would warn about it).
#pragma once

#ifdef __CUDACC__
#define TPCOMM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TPCOMM_HOST_DEVICE inline
#endif

#ifdef __CUDA_ARCH__
#define TPCOMM_UNROLL _Pragma("unroll")
#else
#define TPCOMM_UNROLL
#endif
