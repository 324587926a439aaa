// SPDX-License-Identifier: Apache-2.0
// Two-shot all-reduce: its instantiations (kernels/all_reduce_two_shot.cuh).
#include "kernels/all_reduce_two_shot.cuh"
#include "kernels/common/dispatch.cuh"

namespace tpcomm::kernels {

template <>
const void* instance<KernelId::kTwoShot>(DType dtype, int world_size) noexcept {
  return find_instance(dtype, world_size, [&]<class T, int R>() -> const void* {
    return reinterpret_cast<const void*>(&all_reduce_two_shot_kernel<T, R, Identity>);
  });
}

}  // namespace tpcomm::kernels
