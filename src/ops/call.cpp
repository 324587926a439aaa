// SPDX-License-Identifier: Apache-2.0
#include "ops/call.hpp"

#include "core/check.hpp"

namespace tpcomm {

Status refuse(Call* call, std::string message) noexcept {
  call->message = std::move(message);
  return Status::kInvalidArgument;
}

Status check_view(const GroupShape& shape, const TensorView& v, const char* what, const char* op,
                  Call* call) noexcept {
  if (v.numel() > 0 && v.data == nullptr)
    return refuse(call, detail::concat(op, ": ", what, " is null"));
  if (!v.is_contiguous()) return refuse(call, detail::concat(op, ": ", what, " is not contiguous"));
  if (v.device >= 0 && v.device != shape.device)
    return refuse(call, detail::concat(op, ": ", what, " is on device ", v.device,
                                       ", the group on ", shape.device));
  return Status::kOk;
}

Status check_pair(const GroupShape& shape, const TensorView& in, const TensorView& out,
                  std::int64_t in_factor, std::int64_t out_factor, const char* op,
                  Call* call) noexcept {
  TPCOMM_TRY(check_view(shape, in, "input", op, call));
  TPCOMM_TRY(check_view(shape, out, "output", op, call));
  if (in.dtype != out.dtype)
    return refuse(call, detail::concat(op, ": input is ", to_string(in.dtype), ", output is ",
                                       to_string(out.dtype)));
  if (in.numel() * out_factor != out.numel() * in_factor)
    return refuse(
        call, detail::concat(op, ": output has ", out.numel(), " elements, expected ",
                             in.numel() * out_factor / in_factor, " for an input of ", in.numel()));
  return Status::kOk;
}

}  // namespace tpcomm
