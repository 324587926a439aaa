// SPDX-License-Identifier: Apache-2.0
#include "backends/backend.hpp"

#include "core/log.hpp"

namespace tpcomm {

std::string_view to_string(Op op) noexcept {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllToAll:
      return "all_to_all";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kSend:
      return "send";
    case Op::kRecv:
      return "recv";
    case Op::kAllReduceAddRmsNorm:
      return "all_reduce_add_rmsnorm";
    case Op::kLmHeadExchange:
      return "lm_head_exchange";
  }
  return "unknown";
}

void BackendChain::add(std::unique_ptr<Backend> backend) {
  backends_.push_back(std::move(backend));
  auto slots = std::make_unique<std::atomic<const char*>[]>(kReasonSlots);
  for (int i = 0; i < kReasonSlots; ++i) slots[i].store(nullptr, std::memory_order_relaxed);
  logged_.push_back(std::move(slots));
}

const Backend* BackendChain::select(const Request& request) const noexcept {
  for (const auto& b : backends_)
    if (b->supports(request).ok()) return b.get();
  return nullptr;
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

Status BackendChain::run(const Request& request, Stream stream,
                         const Backend** served_by) noexcept {
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    Backend& b = *backends_[i];
    const Support s = b.supports(request);
    if (!s.ok()) {
      if (i + 1 < backends_.size()) note_fallback(i, s.reason);
      continue;
    }
    Status st = b.run(request, s, stream);
    if (st == Status::kUnsupported) {
      if (i + 1 < backends_.size()) note_fallback(i, "declined at run time");
      continue;
    }
    if (served_by != nullptr) *served_by = &b;
    return st;
  }
  if (served_by != nullptr) *served_by = nullptr;
  return Status::kUnsupported;
}

}  // namespace tpcomm
