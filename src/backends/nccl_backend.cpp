// SPDX-License-Identifier: Apache-2.0
#include "backends/nccl_backend.hpp"

#include <cuda_runtime.h>

#include <span>
#include <utility>
#include <vector>

#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"

namespace tpcomm {

Plan NcclBackend::plan(const Request& r) const noexcept {
  if (const Reduce* sum = r.reduce(); sum != nullptr && sum->fusion != nullptr)
    return Plan::no(sum->moe != nullptr ? "the MoE finalize runs its combine first"
                                        : "fused reductions run on the custom kernels only");
  if (const Exchange* x = r.exchange(); x != nullptr && x->kind == Exchange::Kind::kRegions)
    return Plan::no("the LM-head exchange runs on the custom kernels only");
  return Plan::yes({this});
}

Status NcclBackend::run(const Request& r, const Plan& plan, Stream s) noexcept {
  const Status status = enqueue(r, plan, s);
  const Native* native = r.native();
  if (status == Status::kOk && !r.capturing &&
      (native == nullptr || native->kind != Native::Kind::kSend)) {
    last_out_ = r.out;
    last_stream_ = s;
    last_call_ = r.tag.call;
  }
  return status;
}

void NcclBackend::poison_after_failure(std::uint32_t checked) noexcept {
  if (last_out_.data == nullptr ||
      !(comm_->aborted_unfinished() || (checked != 0 && checked == last_call_)))
    return;
  const TensorView out = std::exchange(last_out_, TensorView{});
  const auto bytes = static_cast<std::size_t>(out.nbytes());
  const std::size_t elem = dtype_size(out.dtype);
  const std::uint64_t pattern = kernels::poison_pattern(out.dtype);
  auto* stream = reinterpret_cast<cudaStream_t>(last_stream_);
  if (pattern == ~std::uint64_t{0}) {
    (void)cudaMemsetAsync(out.data, 0xFF, bytes, stream);
  } else {  // signed integers: the most negative value, its top byte 0x80 and the rest zero
    (void)cudaMemsetAsync(out.data, 0, bytes, stream);
    (void)cudaMemset2DAsync(static_cast<char*>(out.data) + elem - 1, elem, 0x80, 1, bytes / elem,
                            stream);
  }
}

Status NcclBackend::health(std::string* message) noexcept {
  return with_message(comm_->health(), message,
                      [&] { return detail::concat("NCCL: ", comm_->last_error()); });
}

Status NcclBackend::failure(std::string* message) noexcept {
  std::string what;
  const Status s = comm_->poll(&what);
  return with_message(s, message, [&] { return detail::concat("NCCL: ", what); });
}

void NcclBackend::begin_capture() noexcept {
  enabled_before_capture_ = comm_->enabled();
  comm_->set_enabled(true);
}

Status NcclBackend::end_capture(bool) noexcept {
  comm_->set_enabled(enabled_before_capture_);
  return Status::kOk;
}

void NcclBackend::prepare(std::int64_t bytes, Stream stream) {
  if (bytes == 0) return;
  struct Buffers {
    void* in = nullptr;
    void* out = nullptr;
    ~Buffers() {
      cudaFree(in);
      cudaFree(out);
    }
  } b;
  TPCOMM_CUDA_CHECK(cudaMalloc(&b.in, static_cast<std::size_t>(bytes)));
  TPCOMM_CUDA_CHECK(cudaMalloc(&b.out, static_cast<std::size_t>(bytes)));
  const auto enabled = comm_->scope(true);
  const auto per_peer = static_cast<std::size_t>(bytes / comm_->world_size());
  Status s = comm_->all_to_all(b.in, b.out, per_peer, DType::kU8, stream);
  if (s == Status::kOk) s = comm_->wait(stream);
  TPCOMM_CHECK(s == Status::kOk, s,
               "prepare_exchange: NCCL's warm-up all-to-all failed: ", comm_->last_error());
}

Status NcclBackend::enqueue(const Request& r, const Plan&, Stream s) noexcept {
  const auto n = static_cast<std::size_t>(r.out.numel());
  const int world = comm_->world_size();
  if (const Reduce* sum = r.reduce())
    return sum->scattered ? comm_->reduce_scatter(r.in.data, r.out.data, n, r.in.dtype, sum->op, s)
                          : comm_->all_reduce(r.in.data, r.out.data, n, r.in.dtype, sum->op, s);
  if (const Native* native = r.native()) {
    switch (native->kind) {
      case Native::Kind::kBroadcast:
        return comm_->broadcast(r.in.data, r.out.data, n, r.out.dtype, native->peer, s);
      case Native::Kind::kSend:
        return comm_->send(r.in.data, static_cast<std::size_t>(r.in.numel()), r.in.dtype,
                           native->peer, s);
      case Native::Kind::kRecv:
        return comm_->recv(r.out.data, n, r.out.dtype, native->peer, s);
    }
    return Status::kInternal;
  }
  const Exchange& x = *r.exchange();
  switch (x.kind) {
    case Exchange::Kind::kAllGather:
      return comm_->all_gather(r.in.data, r.out.data, static_cast<std::size_t>(r.in.numel()),
                               r.in.dtype, s);
    case Exchange::Kind::kAllToAll:
      if (x.counts != nullptr)
        return comm_->all_to_all(
            r.in.data, r.out.data,
            std::span(x.counts, static_cast<std::size_t>(world) * static_cast<std::size_t>(world)),
            r.in.dtype, s);
      return comm_->all_to_all(r.in.data, r.out.data, n / world, r.in.dtype, s);
    case Exchange::Kind::kGather: {
      // Grouped sends to the root: an all-to-all whose only receiver is the root.
      std::vector<std::int64_t> counts(static_cast<std::size_t>(world) * world, 0);
      for (int src = 0; src < world; ++src)
        counts[static_cast<std::size_t>(src) * world + x.root] = r.in.numel();
      return comm_->all_to_all(r.in.data, r.out.data, counts, r.in.dtype, s);
    }
    case Exchange::Kind::kRegions:
      return Status::kUnsupported;
  }
  return Status::kInternal;
}

}  // namespace tpcomm
