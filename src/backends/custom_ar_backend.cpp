// SPDX-License-Identifier: Apache-2.0
#include "backends/custom_ar_backend.hpp"

#include "backends/exchange_plan.hpp"
#include "tune/selector.hpp"

namespace tpcomm {

Plan CustomArBackend::plan(const Request& r) const noexcept {
  if (const Exchange* x = r.exchange()) {
    if (x->kind == Exchange::Kind::kRegions && !lm_head_) return Plan::no("TPCOMM_LM_HEAD_A2A=0");
    if (x->plan == nullptr) return Plan::no("the exchange has no plan");
    const ExchangePlan& e = *x->plan;
    const ExchangeChoice c =
        select_exchange({e.largest_input, e.largest_output, e.largest_region, e.push_slot_bytes},
                        ar_->caps(), pinned_, pinned_exchange_, *table_);
    if (c.algo == ExchangeAlgo::kNone)
      return Plan::no("input larger than the exchange's staging (Group::prepare_exchange)");
    return Plan::yes({this, Algo::kNone, c.algo, c.shape()});
  }
  const Reduce* sum = r.reduce();
  if (sum == nullptr) return Plan::no("broadcast, send and recv are NCCL's");
  // NOTE [scattered rows]: the reduce-scatter form of the fused norm only.
  if (sum->scattered && (sum->fusion == nullptr || sum->moe != nullptr))
    return Plan::no("the custom kernels reduce-scatter only with the fused norm");
  if (sum->moe != nullptr) {
    // NOTE [the combine's launch]
    if (!moe_prologue_) return Plan::no("TPCOMM_MOE_PROLOGUE is not 1");
    // The combine is a prologue of the kernels that carry kAddRmsNorm (16-bit, no FP8).
    if (sum->fusion->kind != kernels::Fusion::kAddRmsNorm)
      return Plan::no("the combine rides on the fused norm without FP8 only");
  }
  if (sum->fusion != nullptr) {
    const char* why = nullptr;
    const std::int64_t hidden = sum->fusion->hidden;
    const std::int64_t rows = r.in.numel() / hidden;
    const Choice c = sum->scattered ? select_reduce_scatter_add_rmsnorm(rows, hidden, r.in.dtype,
                                                                        ar_->caps(), pinned_, &why)
                                    : select_add_rmsnorm(rows, hidden, r.in.dtype, ar_->caps(),
                                                         pinned_, *table_, &why);
    if (c.algo == Algo::kNone) return Plan::no(why);
    return Plan::yes({this, c.algo, ExchangeAlgo::kNone, c.shape()});
  }
  const Choice c =
      select_all_reduce(r.in.nbytes(), r.in.dtype, sum->op, ar_->caps(), pinned_, *table_);
  if (c.algo == Algo::kNone) return Plan::no("size, dtype or op outside the custom kernels");
  return Plan::yes({this, c.algo, ExchangeAlgo::kNone, c.shape()});
}

Status CustomArBackend::run(const Request& r, const Plan& plan, Stream stream) noexcept {
  const Step& s = plan.step;
  if (s.exchange != ExchangeAlgo::kNone)
    return ar_->exchange(*r.exchange()->plan, r.in, r.out,
                         ExchangeChoice{s.exchange, s.shape.blocks, s.shape.threads}, r.capturing,
                         stream, r.tag);
  const Choice choice{s.algo, s.shape.blocks, s.shape.threads, s.shape.group};
  const Reduce& sum = *r.reduce();
  if (sum.moe != nullptr) {
    // Each rank's input is its combine, computed as it is pushed: `r.in` is never read or written.
    kernels::FusionParams fusion = *sum.fusion;
    fusion.kind = kernels::Fusion::kMoeAddRmsNorm;
    fusion.moe = *sum.moe;
    return ar_->run(r.in, r.out, choice, r.capturing, stream, r.tag, &fusion);
  }
  return ar_->run(r.in, r.out, choice, r.capturing, stream, r.tag, sum.fusion, sum.scattered);
}

Status CustomArBackend::health(std::string* message) noexcept {
  return with_message(ar_->health(), message, [&] { return ar_->error_message(); });
}

std::string CustomArBackend::describe(const Plan& plan) const {
  const Step& s = plan.step;
  return "custom_ar:" +
         std::string(s.exchange != ExchangeAlgo::kNone ? to_string(s.exchange) : to_string(s.algo));
}

}  // namespace tpcomm
