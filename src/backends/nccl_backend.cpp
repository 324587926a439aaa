// SPDX-License-Identifier: Apache-2.0
#include "backends/nccl_backend.hpp"

#include <span>
#include <vector>

namespace tpcomm {

Plan NcclBackend::plan(const Request& r) const noexcept {
  if (r.op == Op::kAllReduceAddRmsNorm)
    return Plan::no("the fused operation runs on the custom kernels only");
  if (r.op == Op::kMoeFinalize) return Plan::no("the MoE finalize runs its combine first");
  if (r.op == Op::kLmHeadExchange)
    return Plan::no("the LM-head exchange runs on the custom kernels only");
  return Plan::yes({this});
}

Status NcclBackend::run(const Request& r, const Plan&, Stream s) noexcept {
  const auto n = static_cast<std::size_t>(r.out.numel());
  const int world = comm_->world_size();
  switch (r.op) {
    case Op::kAllReduce:
      return comm_->all_reduce(r.in.data, r.out.data, n, r.in.dtype, r.reduce, s);
    case Op::kAllGather:
      return comm_->all_gather(r.in.data, r.out.data, static_cast<std::size_t>(r.in.numel()),
                               r.in.dtype, s);
    case Op::kReduceScatter:
      return comm_->reduce_scatter(r.in.data, r.out.data, n, r.in.dtype, r.reduce, s);
    case Op::kAllToAll:
      if (r.counts != nullptr)
        return comm_->all_to_all(
            r.in.data, r.out.data,
            std::span(r.counts, static_cast<std::size_t>(world) * static_cast<std::size_t>(world)),
            r.in.dtype, s);
      return comm_->all_to_all(r.in.data, r.out.data, n / world, r.in.dtype, s);
    case Op::kBroadcast:
      return comm_->broadcast(r.in.data, r.out.data, n, r.out.dtype, r.peer, s);
    case Op::kSend:
      return comm_->send(r.in.data, static_cast<std::size_t>(r.in.numel()), r.in.dtype, r.peer, s);
    case Op::kRecv:
      return comm_->recv(r.out.data, n, r.out.dtype, r.peer, s);
    case Op::kGather: {
      // Grouped sends to the root: an all-to-all whose only receiver is the root.
      std::vector<std::int64_t> counts(static_cast<std::size_t>(world) * world, 0);
      for (int src = 0; src < world; ++src)
        counts[static_cast<std::size_t>(src) * world + r.peer] = r.in.numel();
      return comm_->all_to_all(r.in.data, r.out.data, counts, r.in.dtype, s);
    }
    case Op::kAllReduceAddRmsNorm:
    case Op::kLmHeadExchange:
    case Op::kMoeFinalize:
      return Status::kUnsupported;
  }
  return Status::kInternal;
}

}  // namespace tpcomm
