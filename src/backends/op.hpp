// SPDX-License-Identifier: Apache-2.0
// The operations a group serves, listed once (NOTE [the operation table]).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tpcomm {

// NOTE [the operation table]
// Every operation is one row of `TPCOMM_OPS`, in the order of `Op`'s values (which fingerprints
// carry: appending keeps old ones readable). A row is X(id, name, short_name, c_code):
// - `id`: the `Op` enumerator;
// - `name`: what `to_string` says, the `Group` method's name;
// - `short_name`: the operation's name in `tpcomm_op` (`TPCOMM_OP_` and its upper case) and in
//   Python's `Group.backend_for`;
// - `c_code`: its `tpcomm_op` value, -1 where `tpcomm_group_backend_for` does not take it.
// The C header's enum and Python's list are checked against it by the cpu tier
// (tests/cpu/op_table_test.cpp, python/tests/test_capi.py).
#define TPCOMM_OPS(X)                                                                       \
  X(kAllReduce, "all_reduce", "all_reduce", 0)                                              \
  X(kAllGather, "all_gather", "all_gather", 2)                                              \
  X(kReduceScatter, "reduce_scatter", "reduce_scatter", -1)                                 \
  X(kAllToAll, "all_to_all", "all_to_all", 3)                                               \
  X(kBroadcast, "broadcast", "broadcast", -1)                                               \
  X(kSend, "send", "send", -1)                                                              \
  X(kRecv, "recv", "recv", -1)                                                              \
  /* All-reduce, residual add and RMSNorm in one kernel where the custom backend serves it  \
     (`Request::fusion`), else the all-reduce and the local kernel (ops/fused_norm.hpp). */ \
  X(kAllReduceAddRmsNorm, "all_reduce_add_rmsnorm", "all_reduce_add_rmsnorm", 1)            \
  /* The vocabulary-sharded LM head's exchange (`Request::plan`): the custom exchange, else \
     an all-gather and a local copy (ops/exchange.hpp). */                                  \
  X(kLmHeadExchange, "lm_head_exchange", "lm_head_exchange", -1)                            \
  /* Every rank's input concatenated on rank `Request::peer` (`out` there only). */         \
  X(kGather, "gather", "gather", -1)                                                        \
  /* The MoE combine (`Request::moe`), then kAllReduceAddRmsNorm of it (ops/moe.hpp). */    \
  X(kMoeFinalize, "moe_finalize_all_reduce_add_rmsnorm", "moe_finalize", 4)

/// The collective a request asks for: a row of `TPCOMM_OPS`.
enum class Op : std::uint8_t {
#define TPCOMM_OP_ENUM(id, name, short_name, c_code) id,
  TPCOMM_OPS(TPCOMM_OP_ENUM)
#undef TPCOMM_OP_ENUM
};

/// One row of the table, as data.
struct OpRow {
  Op op;
  std::string_view name;
  std::string_view short_name;
  int c_code;
};

inline constexpr std::array kOps = {
#define TPCOMM_OP_ROW(id, name, short_name, c_code) OpRow{Op::id, name, short_name, c_code},
    TPCOMM_OPS(TPCOMM_OP_ROW)
#undef TPCOMM_OP_ROW
};

inline constexpr std::size_t kOpCount = kOps.size();

/// The row of `op`.
[[nodiscard]] constexpr const OpRow& row(Op op) noexcept {
  return kOps[static_cast<std::size_t>(op)];
}

/// The operation's name ("all_reduce", ...); "unknown" for a value past the table.
[[nodiscard]] constexpr std::string_view to_string(Op op) noexcept {
  return static_cast<std::size_t>(op) < kOpCount ? row(op).name : "unknown";
}

}  // namespace tpcomm
