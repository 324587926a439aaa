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
// carry: appending keeps old ones readable). A row is X(id, name, short_name, c_code, word):
// - `id`: the `Op` enumerator;
// - `name`: what `to_string` says, the `Group` method's name;
// - `short_name`: the operation's name in `tpcomm_op` (`TPCOMM_OP_` and its upper case) and in
//   Python's `Group.backend_for`;
// - `c_code`: its `tpcomm_op` value, -1 where `tpcomm_group_backend_for` does not take it;
// - `word`: what the shape word of its fingerprint holds (`OpWord`), which messages decode.
// The C header's enum and Python's list are checked against it by the cpu tier
// (tests/cpu/op_table_test.cpp, python/tests/test_capi.py).
#define TPCOMM_OPS(X)                                                                            \
  X(kAllReduce, "all_reduce", "all_reduce", 0, kPlain)                                           \
  X(kAllGather, "all_gather", "all_gather", 2, kPlain)                                           \
  X(kReduceScatter, "reduce_scatter", "reduce_scatter", -1, kPlain)                              \
  X(kAllToAll, "all_to_all", "all_to_all", 3, kPlain)                                            \
  X(kBroadcast, "broadcast", "broadcast", -1, kPlain)                                            \
  X(kSend, "send", "send", -1, kPlain)                                                           \
  X(kRecv, "recv", "recv", -1, kPlain)                                                           \
  /* All-reduce, residual add and RMSNorm in one kernel where the custom backend serves it       \
     (`Reduce::fusion`), else the all-reduce and the local kernel (ops/fused_norm.hpp). */       \
  X(kAllReduceAddRmsNorm, "all_reduce_add_rmsnorm", "all_reduce_add_rmsnorm", 1, kFused)         \
  /* The vocabulary-sharded LM head's exchange (`Exchange::kRegions`): the custom exchange, else \
     an all-gather and a local copy (ops/exchange.hpp). */                                       \
  X(kLmHeadExchange, "lm_head_exchange", "lm_head_exchange", -1, kPlain)                         \
  /* Every rank's input concatenated on rank `Exchange::root` (`out` there only). */             \
  X(kGather, "gather", "gather", -1, kRoot)                                                      \
  /* The MoE combine (`Reduce::moe`), then kAllReduceAddRmsNorm of it (ops/moe.hpp). */          \
  X(kMoeFinalize, "moe_finalize_all_reduce_add_rmsnorm", "moe_finalize", 4, kFused)              \
  /* The sequence-parallel fused norm: the reduce-scatter of x's rows, then the residual add     \
     and RMSNorm of the rank's own rows (`Reduce::scattered`, ops/fused_norm.hpp). */            \
  X(kReduceScatterAddRmsNorm, "reduce_scatter_add_rmsnorm", "reduce_scatter_add_rmsnorm", 5, kFused)

/// What the shape word of an operation's fingerprint holds (backends/fingerprint.hpp).
enum class OpWord : std::uint8_t {
  kPlain,  ///< nothing, or a hash of the shape (`shape_hash`), printed as a number
  kFused,  ///< the fused norm's epilogue, form and hidden size (`fused_shape`)
  kRoot,   ///< the rank that receives
};

/// The collective a request asks for: a row of `TPCOMM_OPS`.
enum class Op : std::uint8_t {
#define TPCOMM_OP_ENUM(id, name, short_name, c_code, word) id,
  TPCOMM_OPS(TPCOMM_OP_ENUM)
#undef TPCOMM_OP_ENUM
};

/// One row of the table, as data.
struct OpRow {
  Op op;
  std::string_view name;
  std::string_view short_name;
  int c_code;
  OpWord word;
};

inline constexpr std::array kOps = {
#define TPCOMM_OP_ROW(id, name, short_name, c_code, word) \
  OpRow{Op::id, name, short_name, c_code, OpWord::word},
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
