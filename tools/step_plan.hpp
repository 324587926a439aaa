// SPDX-License-Identifier: Apache-2.0
// `tpcomm step`: a model's shapes (from a JSON file) and the communication of one decode step,
// as a pure plan that the GPU runner (tools/step.cpp) enqueues and the cpu tests check.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backends/op.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm::tools {

/// The shapes of a model that its decode step's communication depends on. Read from a JSON
/// object with these fields (a preset in `models/`, or the user's own file):
///
/// | field | type | meaning |
/// |---|---|---|
/// | `name` | string | the model's name, for reports |
/// | `hidden_size` | integer > 0 | elements of one token's hidden state |
/// | `num_layers` | integer > 0 | decoder layers |
/// | `vocab_size` | integer > 0 | columns of the LM head's logits |
/// | `dtype` | string | activations' type: `bfloat16` or `half` (any name `parse_dtype` knows) |
/// | `moe` | boolean | whether the layers' MLP is a mixture of experts |
/// | `first_dense_layers` | integer >= 0, optional | with `moe`: leading layers with a dense MLP |
/// | `num_experts_per_tok` | integer 1..32, with `moe` | experts each token is routed to (top-k) |
/// | `n_shared_experts` | integer >= 0, optional | with `moe`: shared experts (0: none) |
///
/// Unknown fields are ignored (a model's own config may carry more).
struct ModelSpec {
  std::string name;
  std::int64_t hidden = 0;
  std::int64_t layers = 0;
  std::int64_t vocab = 0;
  DType dtype = DType::kBF16;
  bool moe = false;
  std::int64_t first_dense_layers = 0;
  /// With `moe`: the experts each token is routed to, and whether a shared expert adds its
  /// output to theirs (the combine's inputs, ahead of the layer's all-reduce).
  int top_k = 0;
  std::int64_t shared_experts = 0;
  /// Where the spec came from (a file path), for messages.
  std::string source;
};

/// The largest hidden size, layer count and vocabulary a model file may give: far beyond any
/// model, small enough that no byte count of a step can overflow.
inline constexpr std::int64_t kMaxModelHidden = std::int64_t{1} << 20;
inline constexpr std::int64_t kMaxModelLayers = 4096;
/// Largest model file read, in bytes, and deepest nesting accepted in it (a model is one flat
/// object): bounds checked before the text takes memory.
inline constexpr std::uintmax_t kMaxModelFileBytes = 1 << 20;
inline constexpr int kMaxModelDepth = 8;
inline constexpr std::int64_t kMaxModelVocab = std::int64_t{1} << 24;
/// The most experts per token and shared experts a model file may give (the combine's top-k limit,
/// `kernels::kMoeMaxTopK`).
inline constexpr int kMaxModelTopK = 32;
inline constexpr std::int64_t kMaxModelSharedExperts = 64;

/// Validates and reads a model's JSON object. Throws `Error` (kInvalidArgument) whose message
/// names `source` and the field: missing, of the wrong type, or out of range.
ModelSpec parse_model(const nlohmann::json& j, const std::string& source);

/// Reads and validates the model file at `path`. Throws `Error` naming the file when it cannot
/// be read, is not JSON, or `parse_model` refuses it.
ModelSpec load_model_file(const std::string& path);

/// Where `tpcomm step` looks for data (the `models/` presets and `scripts/plot.py`), in order:
/// the installed tree next to the program (`<bin>/../share/tpcomm`, which a build tree has too),
/// the program's own directory, then the source tree the program was built from. `exe_dir` is
/// the program's directory; `source_dir` the source tree (empty: none).
std::vector<std::string> data_roots(const std::string& exe_dir, const std::string& source_dir);

/// The model file `name_or_file` means: a path when it ends in `.json` or contains a '/', else
/// the preset `<root>/models/<name>.json` of the first root that has it (the name in any case).
/// Throws `Error` (kInvalidArgument) listing the presets found when there is none of that name.
std::string find_model(const std::string& name_or_file, const std::vector<std::string>& roots);

/// Preset names (file stems, sorted) under `<root>/models` of every root.
std::vector<std::string> list_models(const std::vector<std::string>& roots);

/// One communication operation of a decode step.
enum class StepOpKind : std::uint8_t {
  /// The attention output's all-reduce, fused with the residual add and the MLP's input norm.
  kAttnReduce,
  /// A dense MLP's all-reduce, fused with the residual add and the next layer's input norm (the
  /// final norm after the last layer).
  kMlpReduce,
  /// The same for a mixture-of-experts layer (tensor-parallel experts): the combine of every
  /// token's top-k expert outputs (and the shared expert's), then the same all-reduce.
  kMoeReduce,
  /// The vocabulary-sharded LM head's exchange of the logits.
  kLmHead,
};

/// "attn_reduce", "mlp_reduce", "moe_reduce", "lm_head".
std::string_view to_string(StepOpKind k) noexcept;

/// The group's operation a call of kind `k` makes (NOTE [the operation table]).
Op operation(StepOpKind k) noexcept;

/// One operation of the plan, with its shapes (elements) and the bytes of one rank's input and
/// output of its collective. Reductions: `[rows, cols]` = `[tokens, hidden]` in and out; a MoE
/// layer's combine before it reads `top_k` expert rows per token (and the shared expert's row
/// with `shared`). LM head: input
/// `[rows * tp, cols]` (every rank's tokens on this rank's vocabulary shard, `cols` =
/// ceil(vocab / tp)), output `[rows, vocab]`.
struct StepOp {
  StepOpKind kind = StepOpKind::kAttnReduce;
  /// The decoder layer (0-based); the LM head has `layers`.
  std::int64_t layer = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t in_bytes = 0;
  std::int64_t out_bytes = 0;
  /// kMoeReduce: the model's experts per token and whether it has a shared expert.
  int top_k = 0;
  bool shared = false;
  friend bool operator==(const StepOp&, const StepOp&) = default;
};

/// One decode step's communication in the order the model issues it: per layer the attention
/// reduction then the MLP (or MoE) reduction, then the LM head.
struct StepPlan {
  ModelSpec model;
  int tp = 1;
  std::int64_t tokens = 0;
  std::vector<StepOp> ops;

  /// Sum of every operation's input bytes on one rank.
  [[nodiscard]] std::int64_t in_bytes() const noexcept;
  /// Operations of kind `k`.
  [[nodiscard]] std::int64_t count(StepOpKind k) const noexcept;
};

/// The plan of `model` at tensor-parallel size `tp` (>= 1) with `tokens` (>= 1) tokens per rank.
/// Throws `Error` (kInvalidArgument) for a `tp` or `tokens` out of range.
StepPlan plan_step(const ModelSpec& model, int tp, std::int64_t tokens);

}  // namespace tpcomm::tools
