// SPDX-License-Identifier: Apache-2.0
// NcclComm's collectives: each checks its arguments and enqueues under the lock of NOTE [nccl
// from two threads] (nccl_comm_impl.hpp).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backends/nccl_comm_impl.hpp"

namespace tpcomm {

Status NcclComm::ready() const noexcept {
  if (!impl_) return Status::kInvalidArgument;
  if (impl_->health.load() != Status::kOk || impl_->comm == nullptr) return Status::kAborted;
  if (!impl_->enabled) return Status::kUnsupported;
  return Status::kOk;
}

template <class Enqueue>
Status NcclComm::call(DType dtype, Stream stream, Enqueue&& enqueue) noexcept {
  if (!impl_) return Status::kInvalidArgument;
  std::lock_guard lock(impl_->mu);  // NOTE [nccl from two threads]
  TPCOMM_TRY(ready());
  ncclDataType_t type{};
  TPCOMM_TRY(impl_->nccl_type(dtype, type));
  const Status s = enqueue(*impl_, type);
  if (s == Status::kOk) impl_->track(stream);
  return s;
}

Status NcclComm::all_reduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                            Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_reduce", count, in, out));
    return s.finish(
        s.lib->ncclAllReduce(in, out, count, type, NcclLib::to_nccl(op), s.comm, stream),
        "ncclAllReduce");
  });
}

Status NcclComm::all_gather(const void* in, void* out, std::size_t count, DType dtype,
                            Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_gather", count, in, out));
    return s.finish(s.lib->ncclAllGather(in, out, count, type, s.comm, stream), "ncclAllGather");
  });
}

Status NcclComm::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                ReduceOp op, Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("reduce_scatter", count, in, out));
    return s.finish(
        s.lib->ncclReduceScatter(in, out, count, type, NcclLib::to_nccl(op), s.comm, stream),
        "ncclReduceScatter");
  });
}

Status NcclComm::broadcast(const void* in, void* out, std::size_t count, DType dtype, int root,
                           Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("broadcast", "root", root));
    if (root == s.rank) TPCOMM_TRY(s.check_buffer("broadcast", "in (root)", count, in));
    TPCOMM_TRY(s.check_buffer("broadcast", "out", count, out));
    return s.finish(s.lib->ncclBroadcast(in, out, count, type, root, s.comm, stream),
                    "ncclBroadcast");
  });
}

Status NcclComm::send(const void* in, std::size_t count, DType dtype, int peer,
                      Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("send", "peer", peer));
    TPCOMM_TRY(s.check_buffer("send", "in", count, in));
    return s.finish(s.lib->ncclSend(in, count, type, peer, s.comm, stream), "ncclSend");
  });
}

Status NcclComm::recv(void* out, std::size_t count, DType dtype, int peer, Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("recv", "peer", peer));
    TPCOMM_TRY(s.check_buffer("recv", "out", count, out));
    return s.finish(s.lib->ncclRecv(out, count, type, peer, s.comm, stream), "ncclRecv");
  });
}

Status NcclComm::all_to_all(const void* in, void* out, std::size_t count, DType dtype,
                            Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_to_all", count, in, out));
    if (!s.lib->has_all_to_all) {
      const std::vector<std::int64_t> counts(
          static_cast<std::size_t>(s.world_size) * static_cast<std::size_t>(s.world_size),
          static_cast<std::int64_t>(count));
      return s.all_to_all_grouped(in, out, counts, dtype, type, stream);
    }
    return s.finish(s.lib->ncclAlltoAll(in, out, count, type, s.comm, stream), "ncclAlltoAll");
  });
}

Status NcclComm::all_to_all(const void* in, void* out, std::span<const std::int64_t> counts,
                            DType dtype, Stream stream) noexcept {
  return call(dtype, stream, [&](Impl& s, ncclDataType_t type) {
    if (counts.size() !=
        static_cast<std::size_t>(s.world_size) * static_cast<std::size_t>(s.world_size))
      return s.refuse(Status::kInvalidArgument,
                      "all_to_all: the counts do not have world size x world size entries");
    std::int64_t sent = 0;
    std::int64_t received = 0;
    for (int peer = 0; peer < s.world_size; ++peer) {
      sent += counts[static_cast<std::size_t>(s.rank) * s.world_size + peer];
      received += counts[static_cast<std::size_t>(peer) * s.world_size + s.rank];
    }
    TPCOMM_TRY(s.check_buffer("all_to_all", "in", static_cast<std::size_t>(sent), in));
    TPCOMM_TRY(s.check_buffer("all_to_all", "out", static_cast<std::size_t>(received), out));
    return s.all_to_all_grouped(in, out, counts, dtype, type, stream);
  });
}

Status NcclComm::group_start() noexcept {
  if (!impl_) return Status::kInvalidArgument;
  std::lock_guard lock(impl_->mu);
  TPCOMM_TRY(ready());
  TPCOMM_TRY(impl_->finish(impl_->lib->ncclGroupStart(), "ncclGroupStart"));
  ++impl_->group_depth;
  return Status::kOk;
}

Status NcclComm::group_end() noexcept {
  if (!impl_) return Status::kInvalidArgument;
  std::lock_guard lock(impl_->mu);
  TPCOMM_TRY(ready());
  if (impl_->group_depth > 0) --impl_->group_depth;
  return impl_->finish(impl_->lib->ncclGroupEnd(), "ncclGroupEnd");
}

}  // namespace tpcomm
