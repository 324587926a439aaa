// SPDX-License-Identifier: Apache-2.0
#include "tools/bench_runner.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cuda_check.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"

namespace tpcomm::tools {

using kernels::Collective;

Shape shape_of(Collective op, std::int64_t count, int world) {
  switch (op) {
    case Collective::kAllGather:
      return {count / world, count};
    case Collective::kReduceScatter:
      return {count, count / world};
    case Collective::kAllReduce:
    case Collective::kAllToAll:
    case Collective::kBroadcast:
      break;
  }
  return {count, count};
}

Runner::Runner(Bootstrap& boot, int device, const BenchOptions& o, const BenchAlgo& algo,
               std::int64_t exchange_bytes)
    : o_(o), algo_(algo) {
  Options opt = Options::from_env();
  // The `auto` row keeps what TPCOMM_ALGO says; every other group row pins its own.
  if (algo.kind == BenchAlgo::Kind::kGroup && algo.name != "auto") opt.algo = algo.name;
  if (algo.kind == BenchAlgo::Kind::kExchange) opt.exchange_algo = algo.name;
  if (algo.kind == BenchAlgo::Kind::kLmHeadAllGather) opt.lm_head_a2a = Switch::kOff;
  // The MoE finalize's rows that pin an algorithm time its prologue, as "prologue" does.
  if (o.moe && (algo.pins_custom() || algo.name == "prologue")) opt.moe_prologue = Switch::kOn;
  if (algo.name == "combine_first") opt.moe_prologue = Switch::kOff;
  world_ = boot.world_size();
  if (algo.kind == BenchAlgo::Kind::kMemcpy) {
    // nothing to build
  } else if (algo.kind == BenchAlgo::Kind::kNcclDirect) {
    direct_ = std::make_unique<NcclComm>(boot, device, opt);
  } else {
    group_ = std::make_unique<Group>(boot, device, opt);
    if (exchange_op(o))
      group_->prepare_exchange(
          std::max<std::int64_t>(std::int64_t{4} << 20, (exchange_bytes + world_ - 1) / world_));
  }
  if (o.add_rmsnorm) allocate_fused();
  if (o.moe) allocate_moe();
}

Runner::~Runner() {
  for (void* p : {residual_, gamma_, norm_, sum_, map_, weights_, shared_}) cudaFree(p);
}
Status Runner::run(const void* in, void* out, const Shape& s, Stream stream) {
  const DType t = o_.dtype;
  if (algo_.kind == BenchAlgo::Kind::kMemcpy) {
    // The bytes this rank receives: its output for the LM head, else its input.
    const auto bytes = static_cast<std::size_t>(o_.lm_head ? s.out : s.in) * dtype_size(t);
    return cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice,
                           reinterpret_cast<cudaStream_t>(stream)) == cudaSuccess
               ? Status::kOk
               : Status::kCudaError;
  }
  if (direct_) {
    NcclComm& c = *direct_;
    switch (o_.op) {
      case Collective::kAllReduce:
        return c.all_reduce(in, out, s.in, t, o_.redop, stream);
      case Collective::kAllGather:
        return c.all_gather(in, out, s.in, t, stream);
      case Collective::kReduceScatter:
        return c.reduce_scatter(in, out, s.out, t, o_.redop, stream);
      case Collective::kAllToAll:
        return c.all_to_all(in, out, s.in / world_, t, stream);
      case Collective::kBroadcast:
        return c.broadcast(in, out, s.in, t, o_.root, stream);
    }
    return Status::kInternal;
  }
  Group& g = *group_;
  if (o_.add_rmsnorm)
    return o_.scattered ? run_scattered(in, out, s, stream) : run_fused(in, out, s, stream);
  if (o_.lm_head) {
    const LmHead h = lm_head(s);
    return g.lm_head_exchange(
        TensorView::contiguous(const_cast<void*>(in), t, {h.total, h.cols}, g.device()),
        TensorView::contiguous(out, t, {h.rows, o_.vocab}, g.device()), LmHeadLayout::equal(h.rows),
        stream);
  }
  auto iv = TensorView::flat(const_cast<void*>(in), t, s.in, g.device());
  auto ov = TensorView::flat(out, t, s.out, g.device());
  if (o_.gather) return g.gather(iv, g.rank() == o_.root ? ov : TensorView{}, o_.root, stream);
  switch (o_.op) {
    case Collective::kAllReduce:
      return g.all_reduce(iv, ov, stream, o_.redop);
    case Collective::kAllGather:
      return g.all_gather(iv, ov, stream);
    case Collective::kReduceScatter:
      return g.reduce_scatter(iv, ov, stream, o_.redop);
    case Collective::kAllToAll:
      return g.all_to_all(iv, ov, stream);
    case Collective::kBroadcast:
      return g.broadcast(iv, ov, o_.root, stream);
  }
  return Status::kInternal;
}

std::string Runner::served_by(const Shape& s) const {
  if (algo_.kind == BenchAlgo::Kind::kMemcpy) return "cudaMemcpyAsync";
  if (direct_) return "nccl(direct)";
  if (o_.scattered) return scattered_served_by(s);
  if (o_.add_rmsnorm) {
    const auto x = rows(reinterpret_cast<void*>(256), s.out);
    const std::string combine = o_.moe ? "moe_combine+" : "";
    if (algo_.kind == BenchAlgo::Kind::kGroup || algo_.kind == BenchAlgo::Kind::kMoeForm)
      return o_.moe ? group_->backend_for_moe_finalize(x, x, o_.graph)
                    : group_->backend_for_add_rmsnorm(x, x, o_.graph);
    const std::string reduce = group_->backend_for_all_reduce(x, x, o_.graph);
    return algo_.kind == BenchAlgo::Kind::kUnfused ? combine + reduce + "+add_rmsnorm" : reduce;
  }
  if (o_.lm_head) {
    const LmHead h = lm_head(s);
    const auto p = reinterpret_cast<void*>(256);
    return group_->backend_for_lm_head_exchange(
        TensorView::contiguous(p, o_.dtype, {h.total, h.cols}, group_->device()),
        TensorView::contiguous(reinterpret_cast<char*>(p) + (std::int64_t{1} << 40), o_.dtype,
                               {h.rows, o_.vocab}, group_->device()),
        LmHeadLayout::equal(h.rows));
  }
  if (o_.op == Collective::kAllGather || o_.op == Collective::kAllToAll) {
    const auto in =
        TensorView::flat(reinterpret_cast<void*>(256), o_.dtype, s.in, group_->device());
    const auto out = TensorView::flat(reinterpret_cast<char*>(256) + (std::int64_t{1} << 40),
                                      o_.dtype, s.out, group_->device());
    if (o_.gather) return group_->backend_for_gather(in, out, o_.root);
    return o_.op == Collective::kAllGather ? group_->backend_for_all_gather(in, out)
                                           : group_->backend_for_all_to_all(in, out);
  }
  if (o_.op != Collective::kAllReduce) return group_->world_size() == 1 ? "local" : "nccl";
  auto v = TensorView::flat(reinterpret_cast<void*>(256), o_.dtype, s.in, group_->device());
  return group_->backend_for_all_reduce(v, v, o_.graph);
}

std::string Runner::last_error() const {
  if (group_) return group_->last_error();
  return direct_ ? direct_->last_error() : std::string();
}

TensorView Runner::rows(void* p, std::int64_t count) const {
  return TensorView::contiguous(p, o_.dtype, {count / o_.hidden, o_.hidden}, group_->device());
}

void Runner::allocate_fused() {
  // The largest x: its residual, norm_out and sum hold every row for the all-reduce forms.
  const std::int64_t bytes =
      fused_count(o_, o_.max_bytes, world_) * static_cast<std::int64_t>(dtype_size(o_.dtype)) + 256;
  for (void** p : {&residual_, &norm_, &sum_}) {
    TPCOMM_CUDA_CHECK(cudaMalloc(p, static_cast<std::size_t>(bytes)));
    TPCOMM_CUDA_CHECK(cudaMemset(*p, 0, static_cast<std::size_t>(bytes)));
  }
  const auto gamma_bytes = static_cast<std::size_t>(o_.hidden) * dtype_size(o_.dtype);
  TPCOMM_CUDA_CHECK(cudaMalloc(&gamma_, gamma_bytes));
  TPCOMM_CUDA_CHECK(cudaMemset(gamma_, 0, gamma_bytes));
}

void Runner::allocate_moe() {
  const std::int64_t tokens = fused_count(o_.max_bytes, o_.dtype, o_.hidden) / o_.hidden;
  const std::size_t pairs = static_cast<std::size_t>(tokens) * o_.top_k;
  std::vector<std::int32_t> map(pairs);
  std::vector<unsigned char> weights(pairs * dtype_size(o_.dtype), 0);
  // 1.0 in the bench's dtype, for k = 0.
  const std::uint32_t one = o_.dtype == DType::kF32    ? 0x3F800000u
                            : o_.dtype == DType::kBF16 ? 0x3F80u
                                                       : 0x3C00u;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int k = 0; k < o_.top_k; ++k) {
      const auto i = static_cast<std::size_t>(t * o_.top_k + k);
      // Row t of x for k = 0; distinct rows past the largest x for the others, as a step's
      // experts are distinct rows (never one row read top-k times).
      map[i] = static_cast<std::int32_t>(k == 0 ? t : tokens + t * (o_.top_k - 1) + (k - 1));
      if (k == 0)
        std::memcpy(weights.data() + i * dtype_size(o_.dtype), &one, dtype_size(o_.dtype));
    }
  }
  moe_rows_ = tokens * o_.top_k;
  TPCOMM_CUDA_CHECK(cudaMalloc(&map_, map.size() * 4));
  TPCOMM_CUDA_CHECK(cudaMemcpy(map_, map.data(), map.size() * 4, cudaMemcpyHostToDevice));
  TPCOMM_CUDA_CHECK(cudaMalloc(&weights_, weights.size()));
  TPCOMM_CUDA_CHECK(cudaMemcpy(weights_, weights.data(), weights.size(), cudaMemcpyHostToDevice));
  if (o_.shared_expert) {
    const auto bytes = static_cast<std::size_t>(tokens * o_.hidden) * dtype_size(o_.dtype);
    TPCOMM_CUDA_CHECK(cudaMalloc(&shared_, bytes));
    TPCOMM_CUDA_CHECK(cudaMemset(shared_, 0, bytes));
  }
}

MoeCombine Runner::moe(const void* in, std::int64_t count) const {
  const std::int64_t tokens = count / o_.hidden;
  const int device = group_->device();
  return {rows(const_cast<void*>(in), moe_rows_ * o_.hidden),
          TensorView::contiguous(map_, DType::kI32, {tokens, o_.top_k}, device),
          TensorView::contiguous(weights_, o_.dtype, {tokens, o_.top_k}, device),
          shared_ != nullptr ? rows(shared_, count) : TensorView{}};
}

Status Runner::run_fused(const void* in, void* out, const Shape& s, Stream stream) {
  Group& g = *group_;
  const TensorView x = rows(const_cast<void*>(in), s.out);
  const TensorView residual_out = rows(out, s.out);
  const TensorView residual = rows(residual_, s.out);
  const TensorView gamma = TensorView::flat(gamma_, o_.dtype, o_.hidden, g.device());
  switch (algo_.kind) {
    case BenchAlgo::Kind::kUnfused: {
      const TensorView sum = rows(sum_, s.out);
      if (o_.moe) {
        // The chain engines run today: the combine into a tensor of its own, then the pair.
        const TensorView combined = rows(norm_, s.out);
        TPCOMM_TRY(moe_combine(moe(in, s.out), combined, stream));
        TPCOMM_TRY(g.all_reduce(combined, sum, stream));
      } else {
        TPCOMM_TRY(g.all_reduce(x, sum, stream));
      }
      return add_rmsnorm(sum, residual, gamma, kEps, sum, residual_out, stream);
    }
    case BenchAlgo::Kind::kAllReduceOnly:
      return g.all_reduce(x, residual_out, stream);
    default:
      if (o_.moe)
        return g.moe_finalize_all_reduce_add_rmsnorm(moe(in, s.out), residual, gamma, kEps,
                                                     rows(norm_, s.out), residual_out, stream);
      return g.all_reduce_add_rmsnorm(x, residual, gamma, kEps, rows(norm_, s.out), residual_out,
                                      stream);
  }
}

Status Runner::run_scattered(const void* in, void* out, const Shape& s, Stream stream) {
  Group& g = *group_;
  const TensorView x = rows(const_cast<void*>(in), s.in);
  const TensorView gamma = TensorView::flat(gamma_, o_.dtype, o_.hidden, g.device());
  if (algo_.kind == BenchAlgo::Kind::kUnscattered)
    return g.all_reduce_add_rmsnorm(x, rows(residual_, s.in), gamma, kEps, rows(norm_, s.in),
                                    rows(out, s.in), stream);
  const TensorView residual = rows(residual_, s.out);
  const TensorView residual_out = rows(out, s.out);
  if (algo_.kind == BenchAlgo::Kind::kUnfused) {
    const TensorView sum = rows(sum_, s.out);
    TPCOMM_TRY(g.reduce_scatter(x, sum, stream));
    return add_rmsnorm(sum, residual, gamma, kEps, sum, residual_out, stream);
  }
  return g.reduce_scatter_add_rmsnorm(x, residual, gamma, kEps, rows(norm_, s.out), residual_out,
                                      stream);
}

std::string Runner::scattered_served_by(const Shape& s) const {
  const auto p = reinterpret_cast<void*>(256);
  const TensorView x = rows(p, s.in);
  if (algo_.kind == BenchAlgo::Kind::kUnscattered)
    return group_->backend_for_add_rmsnorm(x, x, o_.graph);
  const TensorView mine = rows(static_cast<char*>(p) + (std::int64_t{1} << 40), s.out);
  if (algo_.kind == BenchAlgo::Kind::kGroup)
    return group_->backend_for_reduce_scatter_add_rmsnorm(x, mine, o_.graph);
  // The unfused row's pair: the reduce-scatter, then the local add_rmsnorm.
  return group_->backend_for_reduce_scatter(x, mine) + "+add_rmsnorm";
}

}  // namespace tpcomm::tools
