// SPDX-License-Identifier: Apache-2.0
// The end of a tensor-parallel MoE layer: the combine's checks (tpcomm/moe.hpp says the rules),
// `Group::moe_finalize_all_reduce_add_rmsnorm`'s request, and its path where no kernel carries
// the combine as its prologue: the combine first.
#pragma once

#include <memory>
#include <string>

#include "backends/backend.hpp"
#include "kernels/kernels.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm {

struct Call;
struct GroupShape;

/// Checks `moe` and its output `out` (`[tokens, hidden]`, the experts' dtype) for `op`: kOk with
/// the kernel's arguments in `*params`, or kInvalidArgument with the reason in `*message`.
/// `out.data` may be null when it is not allocated yet (its overlaps are then not checked).
Status check_moe_combine(const MoeCombine& moe, const TensorView& out, const char* op,
                         kernels::MoeCombineParams* params, std::string* message) noexcept;

/// `Group::moe_finalize_all_reduce_add_rmsnorm` (tpcomm/group.hpp says the rules): a
/// kMoeFinalize request whose `in` is x, the combine's output: `norm_out` where that has the
/// experts' dtype and overlaps no input, else null (the path makes a temporary).
Status make_moe_finalize(const GroupShape& g, const MoeCombine& moe, const TensorView& residual,
                         const TensorView& gamma, float eps, const TensorView& norm_out,
                         const TensorView& residual_out, const Fp8Scales& fp8, NormWeight weight,
                         Call* call) noexcept;

/// The MoE finalize as an entry of `chain`: the combine into x (a stream-ordered temporary of the
/// call's own where the request has none, which graphs capture), then the fused all-reduce +
/// norm of x through the chain, with the call's tag. Every rank runs the same fused call, so the
/// ranks' paths agree.
[[nodiscard]] std::unique_ptr<Backend> make_moe_combine_backend(BackendChain& chain);

}  // namespace tpcomm
