// SPDX-License-Identifier: Apache-2.0
// One-shot all-reduce: its instantiations (kernels/all_reduce_one_shot.cuh).
#include <type_traits>

#include "kernels/all_reduce_one_shot.cuh"
#include "kernels/common/dispatch.cuh"

namespace tpcomm::kernels {

const void* all_reduce_one_shot(DType dtype, int world_size, Fusion fusion) noexcept {
  return find_instance(dtype, world_size, fusion, [&]<class T, int R, class E>() -> const void* {
    if constexpr (std::is_same_v<E, Identity>)  // no fused epilogue
      return reinterpret_cast<const void*>(&all_reduce_one_shot_kernel<T, R, E>);
    return nullptr;
  });
}

}  // namespace tpcomm::kernels
