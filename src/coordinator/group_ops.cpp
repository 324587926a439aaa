// SPDX-License-Identifier: Apache-2.0
// The group's operations: each checks its call (ops/), then takes the one path of
// `Group::Impl::call`; `backend_for_*` name the path a call would take, from the same plan.
#include <cuda_runtime.h>

#include <optional>

#include "coordinator/group_impl.hpp"
#include "core/cuda_check.hpp"
#include "ops/exchange.hpp"
#include "ops/fused_norm.hpp"
#include "ops/moe.hpp"
#include "ops/reduce.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm {

Status Group::all_reduce(const TensorView& in, const TensorView& out, Stream stream,
                         ReduceOp op) noexcept {
  Call c;
  return impl_->call(make_all_reduce(impl_->shape(), in, out, op, &c), c, stream);
}

Status Group::reduce_scatter(const TensorView& in, const TensorView& out, Stream stream,
                             ReduceOp op) noexcept {
  Call c;
  return impl_->call(make_reduce_scatter(impl_->shape(), in, out, op, &c), c, stream);
}

Status Group::broadcast(const TensorView& in, const TensorView& out, int root,
                        Stream stream) noexcept {
  Call c;
  return impl_->call(make_broadcast(impl_->shape(), in, out, root, &c), c, stream);
}

Status Group::send(const TensorView& buf, int peer, Stream stream) noexcept {
  Call c;
  return impl_->call(make_point_to_point(impl_->shape(), buf, peer, false, &c), c, stream);
}

Status Group::recv(const TensorView& buf, int peer, Stream stream) noexcept {
  Call c;
  return impl_->call(make_point_to_point(impl_->shape(), buf, peer, true, &c), c, stream);
}

Status Group::all_gather(const TensorView& in, const TensorView& out, Stream stream) noexcept {
  Call c;
  return impl_->call(make_all_gather(impl_->shape(), in, out, &c), c, stream);
}

Status Group::gather(const TensorView& in, const TensorView& out, int root,
                     Stream stream) noexcept {
  Call c;
  return impl_->call(make_gather(impl_->shape(), in, out, root, &c), c, stream);
}

Status Group::all_to_all(const TensorView& in, const TensorView& out, Stream stream) noexcept {
  Call c;
  return impl_->call(make_all_to_all(impl_->shape(), in, out, &c), c, stream);
}

Status Group::all_to_all(const TensorView& in, const TensorView& out,
                         std::span<const std::int64_t> counts, Stream stream) noexcept {
  Call c;
  return impl_->call(make_all_to_all(impl_->shape(), in, out, counts, &c), c, stream);
}

Status Group::lm_head_exchange(const TensorView& shard_logits, const TensorView& out,
                               const LmHeadLayout& layout, Stream stream) noexcept {
  Call c;
  return impl_->call(make_lm_head_exchange(impl_->shape(), shard_logits, out, layout, &c), c,
                     stream);
}

Status Group::all_reduce_add_rmsnorm(const TensorView& x, const TensorView& residual,
                                     const TensorView& gamma, float eps, const TensorView& norm_out,
                                     const TensorView& residual_out, Stream stream,
                                     const Fp8Scales& fp8, NormWeight weight) noexcept {
  Call c;
  return impl_->call(make_all_reduce_add_rmsnorm(impl_->shape(), x, residual, gamma, eps, norm_out,
                                                 residual_out, fp8, weight, &c),
                     c, stream);
}

Status Group::reduce_scatter_add_rmsnorm(const TensorView& x, const TensorView& residual,
                                         const TensorView& gamma, float eps,
                                         const TensorView& norm_out, const TensorView& residual_out,
                                         Stream stream, const Fp8Scales& fp8,
                                         NormWeight weight) noexcept {
  Call c;
  return impl_->call(make_reduce_scatter_add_rmsnorm(impl_->shape(), x, residual, gamma, eps,
                                                     norm_out, residual_out, fp8, weight, &c),
                     c, stream);
}

Status Group::moe_finalize_all_reduce_add_rmsnorm(const MoeCombine& moe, const TensorView& residual,
                                                  const TensorView& gamma, float eps,
                                                  const TensorView& norm_out,
                                                  const TensorView& residual_out, Stream stream,
                                                  const Fp8Scales& fp8,
                                                  NormWeight weight) noexcept {
  Call c;
  return impl_->call(make_moe_finalize(impl_->shape(), moe, residual, gamma, eps, norm_out,
                                       residual_out, fp8, weight, &c),
                     c, stream);
}

std::string Group::backend_for_all_reduce(const TensorView& in, const TensorView& out,
                                          bool capturing) const noexcept {
  return impl_->describe(Request{Op::kAllReduce, in, out, Reduce{}, capturing});
}

namespace {

/// The request of a fused call (`op`: kAllReduceAddRmsNorm or kMoeFinalize) of `x` into
/// `norm_out` as the chain plans it, its epilogue's arguments in `f`; nullopt for an `x` of no
/// columns.
std::optional<Request> fused_request(Op op, const TensorView& x, const TensorView& norm_out,
                                     bool capturing, kernels::FusionParams& f) {
  if (x.ndim < 1 || x.shape[x.ndim - 1] < 1) return std::nullopt;
  f.kind = norm_out.dtype == DType::kF8E4M3 ? kernels::Fusion::kAddRmsNormFp8
                                            : kernels::Fusion::kAddRmsNorm;
  f.hidden = x.shape[x.ndim - 1];
  // The MoE finalize's prologue as plans see it: there, not what it points at.
  static constexpr kernels::MoeCombineParams kCombine{};
  Reduce sum{ReduceOp::kSum, /*scattered=*/op == Op::kReduceScatterAddRmsNorm};
  sum.fusion = &f;
  sum.norm_out = &norm_out;
  if (op == Op::kMoeFinalize) sum.moe = &kCombine;
  return Request{op, x, x, sum, capturing};
}

}  // namespace

std::string Group::backend_for_add_rmsnorm(const TensorView& x, const TensorView& norm_out,
                                           bool capturing) const noexcept {
  kernels::FusionParams f{};
  const auto req = fused_request(Op::kAllReduceAddRmsNorm, x, norm_out, capturing, f);
  return req ? impl_->describe(*req) : "none";
}

std::string Group::backend_for_reduce_scatter_add_rmsnorm(const TensorView& x,
                                                          const TensorView& norm_out,
                                                          bool capturing) const noexcept {
  kernels::FusionParams f{};
  const auto req = fused_request(Op::kReduceScatterAddRmsNorm, x, norm_out, capturing, f);
  return req ? impl_->describe(*req) : "none";
}

std::string Group::backend_for_moe_finalize(const TensorView& x, const TensorView& norm_out,
                                            bool capturing) const noexcept {
  kernels::FusionParams f{};
  const auto req = fused_request(Op::kMoeFinalize, x, norm_out, capturing, f);
  return req ? impl_->describe(*req) : "none";
}

std::string Group::backend_for_all_gather(const TensorView& in,
                                          const TensorView& out) const noexcept {
  Call c;
  if (make_all_gather(impl_->shape(), in, out, &c) != Status::kOk) return "none";
  return impl_->describe(c.request);
}

std::string Group::backend_for_reduce_scatter(const TensorView& in, const TensorView& out,
                                              ReduceOp op) const noexcept {
  Call c;
  if (make_reduce_scatter(impl_->shape(), in, out, op, &c) != Status::kOk) return "none";
  return impl_->describe(c.request);
}

std::string Group::backend_for_gather(const TensorView& in, const TensorView& out,
                                      int root) const noexcept {
  Call c;
  if (make_gather(impl_->shape(), in, out, root, &c) != Status::kOk) return "none";
  return impl_->describe(c.request);
}

std::string Group::backend_for_all_to_all(const TensorView& in,
                                          const TensorView& out) const noexcept {
  Call c;
  if (make_all_to_all(impl_->shape(), in, out, &c) != Status::kOk) return "none";
  return impl_->describe(c.request);
}

std::string Group::backend_for_lm_head_exchange(const TensorView& shard_logits,
                                                const TensorView& out,
                                                const LmHeadLayout& layout) const noexcept {
  Call c;
  if (make_lm_head_exchange(impl_->shape(), shard_logits, out, layout, &c) != Status::kOk)
    return "none";
  return impl_->describe(c.request);
}

void Group::prepare_exchange(std::int64_t bytes_per_peer, Stream stream) {
  Impl& m = *impl_;
  TPCOMM_CHECK(bytes_per_peer >= 0, Status::kInvalidArgument, "prepare_exchange: ", bytes_per_peer,
               " bytes per peer");
  const std::int64_t bytes = bytes_per_peer * world_size();
  DeviceGuard guard(m.device);
  m.chain.each([&](Backend& b) { b.prepare(bytes, stream); });
}

}  // namespace tpcomm
