// SPDX-License-Identifier: Apache-2.0
#include "backends/backend.hpp"

#include "core/log.hpp"

namespace tpcomm {

void BackendChain::add(std::unique_ptr<Backend> backend) {
  backends_.push_back(std::move(backend));
  auto slots = std::make_unique<std::atomic<const char*>[]>(kReasonSlots);
  for (int i = 0; i < kReasonSlots; ++i) slots[i].store(nullptr, std::memory_order_relaxed);
  logged_.push_back(std::move(slots));
}

std::string Backend::describe(const Plan&) const { return std::string(name()); }

std::string BackendChain::describe(const Plan& plan) {
  return plan.ok() ? plan.step.backend->describe(plan) : "none";
}

Plan BackendChain::plan(const Request& request, std::size_t first) const noexcept {
  Plan refused = Plan::no("no backend");
  for (std::size_t i = first; i < backends_.size(); ++i) {
    Plan p = backends_[i]->plan(request);
    if (p.ok()) {
      p.refusal = refused.refusal;
      p.refused_by = refused.refused_by;
      if (p.refused_by == nullptr) p.refusal = nullptr;
      return p;
    }
    if (refused.refused_by == nullptr) {
      refused.refusal = p.refusal;
      refused.refused_by = backends_[i].get();
    }
  }
  return refused;
}

std::size_t BackendChain::index_of(const Backend* backend) const noexcept {
  for (std::size_t i = 0; i < backends_.size(); ++i)
    if (backends_[i].get() == backend) return i;
  return backends_.size();
}

void BackendChain::note_fallback(std::size_t index, const char* reason) noexcept {
  std::atomic<const char*>* slots = logged_[index].get();
  for (int i = 0; i < kReasonSlots; ++i) {
    const char* seen = slots[i].load(std::memory_order_relaxed);
    if (seen == reason) return;
    if (seen == nullptr) {
      if (!slots[i].compare_exchange_strong(seen, reason)) {
        if (seen == reason) return;
        continue;
      }
      break;
    }
  }
  // Past the slots (many distinct reasons) every fallback is logged; still correct, only noisy.
  TPCOMM_LOG_INFO(backends_[index]->name(), " does not serve this request (", reason,
                  "); falling back");
}

Status BackendChain::run(const Request& request, const Plan& plan, Stream stream,
                         const Backend** served_by) noexcept {
  Plan current = plan;
  for (;;) {
    if (served_by != nullptr) *served_by = current.step.backend;
    if (!current.ok()) return Status::kUnsupported;
    const std::size_t i = index_of(current.step.backend);
    if (current.refused_by != nullptr) note_fallback(index_of(current.refused_by), current.refusal);
    Backend& b = *backends_[i];
    const Status st = b.run(request, current, stream);
    if (st != Status::kUnsupported) return st;
    if (i + 1 < backends_.size()) note_fallback(i, "declined at run time");
    current = this->plan(request, i + 1);
  }
}

std::string not_batch_invariant(const Request& req, const Plan& plan,
                                std::int64_t invariant_max_bytes) {
  // The plain reduce-scatter is outside what deterministic groups keep (docs/DETERMINISM.md).
  const Reduce* r = req.reduce();
  if (r == nullptr || (r->scattered && r->fusion == nullptr)) return {};
  if (!any_step(plan, [](const Backend& b) { return !b.batch_invariant(); })) return {};
  return detail::concat(to_string(req.op), " of ", req.in.nbytes(), " bytes (",
                        to_string(req.in.dtype),
                        ") is not batch-invariant: ", BackendChain::describe(plan), " serves it; ",
                        invariant_max_bytes > 0
                            ? detail::concat("the custom kernels hold up to ", invariant_max_bytes,
                                             " bytes (TPCOMM_CUSTOM_AR_MAX_BYTES)")
                            : std::string("this group has no custom all-reduce"));
}

}  // namespace tpcomm
