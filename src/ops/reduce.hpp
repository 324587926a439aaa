// SPDX-License-Identifier: Apache-2.0
// The reductions and the point-to-point calls: their checks and requests (ops/call.hpp).
#pragma once

#include <memory>

#include "backends/backend.hpp"
#include "ops/call.hpp"

namespace tpcomm {

/// `Group::all_reduce`: `out` holds `in`'s elements reduced with `op` over the ranks.
Status make_all_reduce(const GroupShape& g, const TensorView& in, const TensorView& out,
                       ReduceOp op, Call* call) noexcept;

/// `Group::reduce_scatter`: `in` holds world x `out`'s elements.
Status make_reduce_scatter(const GroupShape& g, const TensorView& in, const TensorView& out,
                           ReduceOp op, Call* call) noexcept;

/// The reduce-scatter where no backend serves it (NCCL missing, or refusing ranks that share a
/// GPU), as an entry of `chain`: the all-reduce of the whole input through the chain into a
/// temporary of the call's own (stream-ordered, so graphs capture it), then this rank's part
/// copied out. Every rank runs the same all-reduce, so the ranks' paths agree.
[[nodiscard]] std::unique_ptr<Backend> make_reduce_slice_backend(BackendChain& chain,
                                                                 const GroupShape& g);

/// `Group::broadcast` from `root`: `in` is read on the root only.
Status make_broadcast(const GroupShape& g, const TensorView& in, const TensorView& out, int root,
                      Call* call) noexcept;

/// `Group::send` (`receive` false) or `Group::recv` of `buf` to or from `peer`.
Status make_point_to_point(const GroupShape& g, const TensorView& buf, int peer, bool receive,
                           Call* call) noexcept;

}  // namespace tpcomm
