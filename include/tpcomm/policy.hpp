// SPDX-License-Identifier: Apache-2.0
// Startup policy: whether an inference engine turns a communication feature on, as SGLang
// decides it from the model, the GPU, the parallel layout and the user's flags.
//
// Every rule here has the same shape, so that the next one sits beside the first:
//   - `XxxInputs`: the facts the rule reads, as the engine knows them at startup;
//   - `XxxDecision`: `enabled` plus a one-line `reason` naming the condition that decided;
//   - `decide_xxx(const XxxInputs&)`: a pure function (no I/O, no CUDA, no environment).
// The user's own setting is a `Switch` (tpcomm/types.hpp): `kOn` and `kOff` always win, `kAuto`
// applies the rule.
//
// Rank invariance: the inputs are facts every rank of the job shares (model, GPU model, sizes,
// flags), so every rank reaches the same decision without communicating. Pass the same inputs
// on every rank; a decision made from per-rank facts could leave ranks on different paths.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tpcomm/types.hpp"

namespace tpcomm {

// ---------------------------------------------------------------------------------------------
// Fused all-reduce + residual-add + RMSNorm

/// Which implementation SGLang's backend resolution picks for the fused all-reduce (the values
/// of `--flashinfer-allreduce-fusion-backend` after resolution). tpcomm reports the choice so an
/// engine that mirrors SGLang's flags can log and compare it; the two differ in how the peers'
/// workspace memory is shared.
enum class FusionBackend : std::uint8_t {
  /// Fusion is off.
  kNone,
  /// One node, SM90: the workspace is shared through CUDA IPC handles.
  kTrtllm,
  /// SM10x (Blackwell), one node or several: the workspace is fabric memory reachable over
  /// (multi-node) NVLink. tpcomm's custom kernels share peer memory within one node only
  /// (docs/DESIGN.md §4); across nodes the all-reduce is NCCL's.
  kMnnvl,
};

/// "none", "trtllm", "mnnvl".
std::string_view to_string(FusionBackend b) noexcept;

/// What `decide_allreduce_fusion` reads. The defaults describe one SM90 node with nothing
/// special set; `architecture` and `tp_size` must come from the engine.
struct FusionInputs {
  /// The model's architecture as its Hugging Face config names it (`architectures[0]`), e.g.
  /// "DeepseekV3ForCausalLM". Compared exactly (case-sensitive).
  std::string architecture;
  /// The GPU's compute capability as major * 10 + minor: 90 (H100, H200), 100 (B200),
  /// 103 (B300), 120 (RTX 50). 0 means unknown, which no rule accepts.
  int sm = 90;
  /// Tensor-parallel ranks (`--tp-size`), at least 1.
  int tp_size = 1;
  /// DP attention (`--enable-dp-attention`).
  bool enable_dp_attention = false;
  /// Nodes the job spans (`--nnodes`), at least 1.
  int nnodes = 1;
  /// The MoE all-to-all backend (`--moe-a2a-backend`): "none", "deepep", "mooncake", ...
  std::string moe_a2a_backend = "none";
  /// Deterministic inference (`--enable-deterministic-inference`).
  bool deterministic_inference = false;
  /// The group is deterministic (`TPCOMM_DETERMINISTIC` or `GroupConfig::deterministic` on or
  /// strict): its fused kernels are batch-invariant (docs/DETERMINISM.md), so deterministic
  /// inference need not turn the automatic fusion off.
  bool deterministic_group = false;
  /// The user's setting: SGLang's `--flashinfer-allreduce-fusion-backend` given (kOn),
  /// `--enforce-disable-flashinfer-allreduce-fusion` (kOff), neither (kAuto).
  Switch fusion = Switch::kAuto;
};

/// The outcome of `decide_allreduce_fusion`.
struct FusionDecision {
  /// Turn the fused all-reduce + residual + RMSNorm on (in SGLang this also lets plain
  /// all-reduces use the fusion workspace, SGLang PR #30700).
  bool enabled = false;
  /// The resolved backend; kNone exactly when `enabled` is false.
  FusionBackend backend = FusionBackend::kNone;
  /// One line naming the condition that decided, e.g. "architecture LlamaForCausalLM is not in
  /// the allow-list"; for an automatic yes, every condition that held.
  std::string reason;
};

/// The model architectures for which the automatic rule enables the fusion (SGLang's
/// allow-list of models that implement the fused path), in a fixed order.
std::span<const std::string_view> allreduce_fusion_architectures() noexcept;

/// Whether to turn on the fused all-reduce + residual + RMSNorm, as SGLang decides it
/// (`_flashinfer_allreduce_fusion_auto_enable`, then its backend resolution).
///
/// - kOff: off.
/// - kOn: on, whatever the automatic conditions say (deterministic inference included).
/// - kAuto: off under deterministic inference, unless the group is deterministic too (its fused
///   kernels are batch-invariant, and the reason says so); otherwise on only when all of these
///   hold:
///   the architecture is in `allreduce_fusion_architectures()`; the GPU is SM90 or SM10x;
///   tp_size > 1; DP attention is off; one node, or SM10x; the MoE all-to-all backend is
///   "none". The reason names the first condition that fails, in that order.
///
/// Backend when on: SM10x → kMnnvl (one node or several); SM90 on one node → kTrtllm.
///
/// Pure and deterministic; thread-safe. Throws `Error(kInvalidArgument)` when tp_size,
/// nnodes or sm is out of range, and when kOn asks for what no backend provides (a GPU other
/// than SM90/SM10x, or several SM90 nodes) — SGLang refuses to start there as well.
[[nodiscard]] FusionDecision decide_allreduce_fusion(const FusionInputs& inputs);

// ---------------------------------------------------------------------------------------------
// Vocabulary-sharded LM head: one all-to-all

/// The role of this server in prefill/decode disaggregation (SGLang's `--disaggregation-mode`).
enum class DisaggregationMode : std::uint8_t {
  /// Not disaggregated: one server runs both prefill and decode (SGLang's "null", the default).
  kNull,
  /// A prefill-only server.
  kPrefill,
  /// A decode-only server.
  kDecode,
};

/// "null", "prefill", "decode" (SGLang's spellings).
std::string_view to_string(DisaggregationMode m) noexcept;

/// What `decide_lm_head_a2a` reads. The defaults describe a colocated server without DP
/// attention, which the automatic rule leaves off.
struct LmHeadA2aInputs {
  /// This server's role (`--disaggregation-mode`).
  DisaggregationMode disaggregation_mode = DisaggregationMode::kNull;
  /// DP attention (`--enable-dp-attention`).
  bool enable_dp_attention = false;
  /// Data-parallel attention ranks (`--dp-size`), at least 1.
  int dp_size = 1;
  /// Tensor-parallel ranks (`--tp-size`), at least 1: the LM head's vocabulary is split into
  /// this many shards.
  int tp_size = 1;
  /// Context-parallel ranks of attention (`--attn-cp-size`), at least 1.
  int attn_cp_size = 1;
  /// The DP LM head (`--enable-dp-lm-head`): every DP rank holds the whole vocabulary and no
  /// logits are exchanged.
  bool enable_dp_lm_head = false;
  /// The user's setting: SGLang's `--enable-tp-lm-head-all-to-all` true (kOn), false (kOff),
  /// not given (kAuto); `Options::lm_head_a2a` (`TPCOMM_LM_HEAD_A2A`) carries it.
  Switch lm_head_a2a = Switch::kAuto;
};

/// The outcome of `decide_lm_head_a2a`.
struct LmHeadA2aDecision {
  /// Assemble the vocabulary-sharded LM head's logits with one all-to-all instead of an
  /// all-gather along the vocabulary followed by the DP scatter.
  bool enabled = false;
  /// One line naming the condition that decided, e.g. "DP attention is off"; for an automatic
  /// yes, every condition that held.
  std::string reason;
};

/// Whether the tensor-parallel LM head assembles each rank's logits with one all-to-all, as
/// SGLang decides it at startup (`_tp_lm_head_all_to_all_default` and the checks that follow,
/// SGLang PR #32313). With tp_size == dp_size every rank is one DP rank: the LM head's GEMM
/// yields all ranks' tokens under this rank's vocabulary shard, and each rank needs only its
/// own tokens under every shard, so the all-to-all moves 1/tp_size of what an all-gather of
/// the shards moves.
///
/// - kOff: off.
/// - kOn: on, whatever the server's role and dp_size, provided the layout can carry the
///   exchange at all: DP attention on, the DP LM head off, tp_size == dp_size,
///   attn_cp_size == 1 (checked in that order, as SGLang asserts them). Otherwise throws
///   `Error(kInvalidArgument)` naming the flag and its value.
/// - kAuto: on only when all of these hold: a disaggregated decode server; DP attention on;
///   dp_size > 1; tp_size == dp_size; attn_cp_size == 1; the DP LM head off. The reason names
///   the first condition that fails, in that order. Prefill and colocated servers keep the
///   all-gather.
///
/// This is the startup decision only. SGLang also checks every call
/// (`_can_use_tp_lm_head_all_to_all`: the same row count on every rank, an LM head sharded over
/// the whole TP group) and takes the all-gather for a batch that does not fit the exchange.
///
/// Pure and deterministic; thread-safe. Throws `Error(kInvalidArgument)` when dp_size, tp_size
/// or attn_cp_size is below 1, under every switch.
[[nodiscard]] LmHeadA2aDecision decide_lm_head_a2a(const LmHeadA2aInputs& inputs);

}  // namespace tpcomm
