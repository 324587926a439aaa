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
  /// (DESIGN.md §4); across nodes the all-reduce is NCCL's.
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
/// - kAuto: off under deterministic inference; otherwise on only when all of these hold:
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

}  // namespace tpcomm
