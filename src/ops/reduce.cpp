// SPDX-License-Identifier: Apache-2.0
#include "ops/reduce.hpp"

#include "backends/fingerprint.hpp"
#include "core/check.hpp"

namespace tpcomm {

Status make_all_reduce(const GroupShape& g, const TensorView& in, const TensorView& out,
                       ReduceOp op, Call* call) noexcept {
  TPCOMM_TRY(check_pair(g, in, out, 1, 1, "all_reduce", call));
  call->request = Request{Op::kAllReduce, in, out, Reduce{op}};
  call->request.tag.fingerprint =
      fingerprint(Op::kAllReduce, in.dtype, in.numel(), static_cast<std::uint32_t>(op));
  return Status::kOk;
}

Status make_reduce_scatter(const GroupShape& g, const TensorView& in, const TensorView& out,
                           ReduceOp op, Call* call) noexcept {
  TPCOMM_TRY(check_pair(g, in, out, g.world, 1, "reduce_scatter", call));
  call->request = Request{Op::kReduceScatter, in, out, Reduce{op, /*scattered=*/true}};
  call->request.tag.fingerprint =
      fingerprint(Op::kReduceScatter, in.dtype, in.numel(), static_cast<std::uint32_t>(op));
  return Status::kOk;
}

Status make_broadcast(const GroupShape& g, const TensorView& in, const TensorView& out, int root,
                      Call* call) noexcept {
  if (root < 0 || root >= g.world)
    return refuse(call, detail::concat("broadcast: root ", root, " is not a rank of ", g.world));
  if (g.rank == root) {
    TPCOMM_TRY(check_pair(g, in, out, 1, 1, "broadcast", call));
  } else {
    TPCOMM_TRY(check_view(g, out, "output", "broadcast", call));
  }
  call->request = Request{Op::kBroadcast, g.rank == root ? in : out, out,
                          Native{Native::Kind::kBroadcast, root}};
  call->request.tag.fingerprint =
      fingerprint(Op::kBroadcast, out.dtype, out.numel(), static_cast<std::uint32_t>(root));
  return Status::kOk;
}

Status make_point_to_point(const GroupShape& g, const TensorView& buf, int peer, bool receive,
                           Call* call) noexcept {
  const char* op = receive ? "recv" : "send";
  TPCOMM_TRY(check_view(g, buf, "buffer", op, call));
  if (peer < 0 || peer >= g.world || peer == g.rank)
    return refuse(call, detail::concat(op, ": peer ", peer, " is not another rank of ", g.world));
  // Two ranks only: no call number, no fingerprint (the kernels of a group never see them).
  call->request = Request{receive ? Op::kRecv : Op::kSend, buf, buf,
                          Native{receive ? Native::Kind::kRecv : Native::Kind::kSend, peer}};
  return Status::kOk;
}

}  // namespace tpcomm
