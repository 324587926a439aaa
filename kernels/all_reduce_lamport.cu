// SPDX-License-Identifier: Apache-2.0
// Lamport all-reduce: its instantiations (kernels/all_reduce_lamport.cuh).
#include "kernels/all_reduce_lamport.cuh"
#include "kernels/common/dispatch.cuh"

namespace tpcomm::kernels {

template <>
const void* instance<KernelId::kLamport>(DType dtype, int world_size) noexcept {
  return find_instance(dtype, world_size, [&]<class T, int R>() -> const void* {
    if constexpr (sizeof(T) == 2)
      return reinterpret_cast<const void*>(
          &all_reduce_lamport_kernel<T, R, Identity>);  // 16-bit types only
    return nullptr;
  });
}

}  // namespace tpcomm::kernels
