// SPDX-License-Identifier: Apache-2.0
// Lamport two-shot all-reduce: its instantiations (kernels/all_reduce_lamport_two_shot.cuh).
#include "kernels/all_reduce_lamport_two_shot.cuh"
#include "kernels/common/dispatch.cuh"

namespace tpcomm::kernels {

const void* all_reduce_lamport_two_shot(DType dtype, int world_size, Fusion fusion) noexcept {
  return find_instance(dtype, world_size, fusion, [&]<class T, int R, class E>() -> const void* {
    if constexpr (sizeof(T) == 2)  // 16-bit types only
      return reinterpret_cast<const void*>(&all_reduce_lamport_two_shot_kernel<T, R, E>);
    return nullptr;
  });
}

}  // namespace tpcomm::kernels
