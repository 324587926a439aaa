// SPDX-License-Identifier: Apache-2.0
// A backend serves some collectives; the chain plans each call once, asking the backends in
// order, and runs the plan (docs/DESIGN.md).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kernels.hpp"
#include "tpcomm/lm_head.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {

class Backend;

struct ExchangePlan;  // backends/exchange_plan.hpp

/// The collective a request asks for.
enum class Op : std::uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kSend,
  kRecv,
  /// All-reduce, residual add and RMSNorm in one kernel (`Request::fusion`); only the custom
  /// backend serves it (the group falls back to all-reduce + the local kernel otherwise).
  kAllReduceAddRmsNorm,
  /// The vocabulary-sharded LM head's exchange (`Request::plan`); only the custom backend serves
  /// it (the group falls back to an all-gather and a local copy otherwise).
  kLmHeadExchange,
  /// Every rank's input concatenated on rank `Request::peer` (`out` there; empty elsewhere).
  kGather,
  /// The MoE combine (`Request::moe`), then kAllReduceAddRmsNorm of it: served by the custom
  /// backend with the combine as the Lamport kernels' prologue, else by the composite that runs
  /// the combine into `in` first (ops/moe.hpp).
  kMoeFinalize,
};

std::string_view to_string(Op op) noexcept;

/// A call's identity as its kernels carry it (NOTE [fingerprints] in kernels/common/sync.cuh):
/// the fingerprint of what was asked (backends/fingerprint.hpp), and the group's count of
/// collective calls when it was made (a captured call keeps the number it was captured with).
/// Both the same on every rank for the same call.
struct CallTag {
  std::uint64_t fingerprint = 0;
  std::uint32_t call = 0;
};

/// One collective call, already validated by the group. Every field is identical on every rank
/// for the same call (except the pointers), which is what makes backend decisions rank-invariant.
struct Request {
  Op op = Op::kAllReduce;
  TensorView in;
  TensorView out;
  ReduceOp reduce = ReduceOp::kSum;
  /// Root of a broadcast or a gather, peer of a send/recv; -1 otherwise.
  int peer = -1;
  /// The stream is being captured into a CUDA graph.
  bool capturing = false;
  /// kAllReduceAddRmsNorm: the epilogue's arguments (`in` is x, `out` is residual_out), and the
  /// residual (an empty view without one) and the norm's output, which the unfused path needs.
  const kernels::FusionParams* fusion = nullptr;
  const TensorView* residual = nullptr;
  const TensorView* norm_out = nullptr;
  /// kAllToAll with per-peer counts: `counts[s * world + d]` elements go from rank s to rank d
  /// (the same matrix on every rank); nullptr for the equal split.
  const std::int64_t* counts = nullptr;
  /// kAllGather, kAllToAll, kLmHeadExchange, kGather: what this rank copies from each rank, when
  /// the group may serve it with the custom kernels (world size 2..8); nullptr otherwise.
  const ExchangePlan* plan = nullptr;
  /// kLmHeadExchange: the rows each rank holds.
  const LmHeadLayout* layout = nullptr;
  /// kMoeFinalize: the combine's arguments (with the fused norm's above); `in` is where the
  /// combine writes x, null where the call makes a temporary for it.
  const kernels::MoeCombineParams* moe = nullptr;
  /// What the call was, for the kernels to check against their peers'. A fallback's inner calls
  /// carry the outer call's tag.
  CallTag tag{};
};

/// One step of a plan: the backend that runs it and, for the custom backend, the kernel and its
/// launch shape (an all-reduce algorithm, or an exchange algorithm).
struct Step {
  const Backend* backend = nullptr;
  Algo algo = Algo::kNone;
  ExchangeAlgo exchange = ExchangeAlgo::kNone;
  kernels::LaunchShape shape{};
};

/// How one call runs: decided once per call (`BackendChain::plan`) from the request's
/// rank-invariant facts, then run as it is. A composite path (the all-reduce, then the local
/// norm; the all-gather, then the copy) is a step whose backend runs an inner call through the
/// chain, and composites nest (the MoE finalize's combine, then the fused call, which may itself
/// be the all-reduce and the local norm): `inner` holds the inner calls' steps, outermost first.
struct Plan {
  /// The most composite steps one call nests, its own step included.
  static constexpr std::size_t kMaxDepth = 3;

  Step step;
  std::array<Step, kMaxDepth - 1> inner{};
  /// Why the first backend asked does not serve the call (a static string, logged once per
  /// reason), or why none does when `step.backend` is null.
  const char* refusal = nullptr;
  const Backend* refused_by = nullptr;

  [[nodiscard]] bool ok() const noexcept { return step.backend != nullptr; }
  /// A backend's yes: `step`, its backend set.
  static Plan yes(Step step) noexcept { return {step, {}, nullptr, nullptr}; }
  /// A composite's yes: `step`, then the inner call's plan `in` (no deeper than kMaxDepth - 1).
  static Plan around(Step step, const Plan& in) noexcept {
    Plan p = yes(step);
    p.inner[0] = in.step;
    for (std::size_t i = 1; i < p.inner.size(); ++i) p.inner[i] = in.inner[i - 1];
    return p;
  }
  /// A backend's no, with a static string saying why.
  static Plan no(const char* why) noexcept { return {{}, {}, why, nullptr}; }

  /// Whether `around(…, *this)` would lose a step (composites nested deeper than kMaxDepth).
  [[nodiscard]] bool full() const noexcept { return inner.back().backend != nullptr; }
  /// The plan of the inner call, one level down.
  [[nodiscard]] Plan inner_plan() const noexcept {
    Plan p = yes(inner[0]);
    for (std::size_t i = 1; i < inner.size(); ++i) p.inner[i - 1] = inner[i];
    return p;
  }
};

/// A way to run collectives. `plan` is pure and cheap and depends only on rank-invariant facts
/// (sizes, dtype, shape, group configuration, capture state), never on pointer values; it is
/// called once per call. `run` may still return kUnsupported (the chain then plans the call
/// again on the backends after it); any other status is final.
class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// `Plan::yes` with a step of this backend, or `Plan::no` with the reason.
  [[nodiscard]] virtual Plan plan(const Request& request) const noexcept = 0;
  /// Serves `request` as `plan` (this backend's yes for it) says.
  [[nodiscard]] virtual Status run(const Request& request, const Plan& plan,
                                   Stream stream) noexcept = 0;
  /// The path `plan` takes, in words: "nccl", "custom_ar:lamport",
  /// "custom_ar:two_shot+add_rmsnorm", "all_gather:custom_ar:pull+copy".
  [[nodiscard]] virtual std::string describe(const Plan& plan) const;
  /// What went wrong in the last `run` that failed, where the backend knows more than a status.
  [[nodiscard]] virtual std::string last_error() const { return {}; }
};

/// Whether `backend` runs a step of `plan`: its own, or one of a composite's inner calls.
[[nodiscard]] bool runs_on(const Plan& plan, const Backend* backend) noexcept;

/// For a deterministic group (NOTE [batch invariance] in tune/selector.hpp): empty when `req`,
/// planned as `plan`, is batch-invariant — an operation other than the all-reduce, the fused norm
/// and the MoE finalize, or one that `nccl` reduces in none of its steps —, else why not, naming
/// the call's size, its path and `custom_max_bytes`, the largest all-reduce the group's custom
/// kernels hold (0: the group has none). Pure.
[[nodiscard]] std::string not_batch_invariant(const Request& req, const Plan& plan,
                                              const Backend* nccl, std::int64_t custom_max_bytes);

/// The ordered backends of a group. Not thread-safe for `add`; `plan`/`run` may be called
/// concurrently with each other.
class BackendChain {
 public:
  void add(std::unique_ptr<Backend> backend);

  /// The first backend's plan that says yes, starting at backend `first`; else `Plan::no` with
  /// the last reason. Pure.
  [[nodiscard]] Plan plan(const Request& request, std::size_t first = 0) const noexcept;

  /// Runs `request` as `plan` says. `kUnsupported` from the backend's `run` plans the call again
  /// on the backends after it; any other status is returned as is (falling back on a real error
  /// hides bugs and can hang peers). Each (backend, reason) pair of a fallback is logged once.
  /// `served_by`, when given, receives the backend that returned (nullptr: none could serve).
  [[nodiscard]] Status run(const Request& request, const Plan& plan, Stream stream,
                           const Backend** served_by = nullptr) noexcept;

  /// `plan`, then `run`.
  [[nodiscard]] Status run(const Request& request, Stream stream,
                           const Backend** served_by = nullptr) noexcept {
    return run(request, plan(request), stream, served_by);
  }

  /// The path `plan` takes, in words (`Backend::describe`), or "none".
  [[nodiscard]] static std::string describe(const Plan& plan);

 private:
  void note_fallback(std::size_t index, const char* reason) noexcept;
  [[nodiscard]] std::size_t index_of(const Backend* backend) const noexcept;

  std::vector<std::unique_ptr<Backend>> backends_;
  // Reasons already logged per backend; reasons are static strings, compared by address so the
  // hot path never allocates or locks.
  static constexpr int kReasonSlots = 16;
  std::vector<std::unique_ptr<std::atomic<const char*>[]>> logged_;
};

}  // namespace tpcomm
