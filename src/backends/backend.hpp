// SPDX-License-Identifier: Apache-2.0
// A backend serves some collectives; the chain plans each call once, asking the backends in
// order, and runs the plan (docs/DESIGN.md).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "backends/op.hpp"
#include "kernels/kernels.hpp"
#include "tpcomm/lm_head.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"
#include "tune/algorithms.hpp"
#include "tune/table.hpp"

namespace tpcomm {

class Backend;

struct ExchangePlan;  // backends/exchange_plan.hpp

/// A call's identity as its kernels carry it (NOTE [fingerprints] in kernels/common/sync.cuh):
/// the fingerprint of what was asked (backends/fingerprint.hpp), and the group's count of
/// collective calls when it was made (a captured call keeps the number it was captured with).
/// Both the same on every rank for the same call.
struct CallTag {
  std::uint64_t fingerprint = 0;
  std::uint32_t call = 0;
};

// NOTE [three primitives]
// Every operation lowers its call to one of three primitives, which is all a backend looks at
// to plan and run it: `Reduce` (a sum over the ranks, with the fused norm's epilogue, the MoE
// combine's prologue, or scattered), `Exchange` (data moved between ranks without arithmetic:
// the all-gather, the gather, the all-to-all and the LM head's regions) and `Native` (what only
// NCCL does: broadcast, send, recv). Each backend serves the primitives it can (NCCL all three,
// the custom kernels `Reduce` and `Exchange`), so a new operation is new `ops/` files that lower
// to them, and touches no backend; an operation's own fallback is a composite of its `ops/`
// files, which serves its `Op` by running other operations through the chain.

/// A reduction over the ranks.
struct Reduce {
  ReduceOp op = ReduceOp::kSum;
  /// Each rank's `out` is its slice of the sum: `in` splits into world slices, rank r's r-th.
  bool scattered = false;
  /// The fused norm's epilogue (null: the sum alone): `in` is x, `out` residual_out; with the
  /// residual (an empty view without one) and norm_out, which the unfused path needs.
  const kernels::FusionParams* fusion = nullptr;
  const TensorView* residual = nullptr;
  const TensorView* norm_out = nullptr;
  /// The MoE combine as the prologue (null: none): each rank's x is its combine, which it writes
  /// into `in` (null where the call makes a temporary for it) or computes as it sends.
  const kernels::MoeCombineParams* moe = nullptr;
};

/// Data copied between ranks.
struct Exchange {
  enum class Kind : std::uint8_t {
    kAllGather,  ///< every rank's input, in rank order, on every rank
    kGather,     ///< every rank's input, in rank order, on rank `root` only
    kAllToAll,   ///< chunk d of rank s's input to rank d, at chunk s of its output
    kRegions,    ///< the regions `plan` names only (the LM head's rows): the custom exchange
  };
  Kind kind = Kind::kAllGather;
  /// What this rank copies from each rank, when the group may serve it with the custom kernels
  /// (world size 2..8); nullptr otherwise.
  const ExchangePlan* plan = nullptr;
  /// kAllToAll with per-peer counts: `counts[s * world + d]` elements go from rank s to rank d
  /// (the same matrix on every rank); nullptr for the equal split.
  const std::int64_t* counts = nullptr;
  /// kGather: the rank that receives.
  int root = -1;
  /// kRegions of the LM head: the rows each rank holds (its fallback copies by them).
  const LmHeadLayout* layout = nullptr;
};

/// What only NCCL does.
struct Native {
  enum class Kind : std::uint8_t { kBroadcast, kSend, kRecv };
  Kind kind = Kind::kBroadcast;
  /// The root of a broadcast, the peer of a send or recv.
  int peer = -1;
};

/// One collective call, already validated by the group: its operation, its tensors and its
/// primitive. Every field is identical on every rank for the same call (except the pointers),
/// which is what makes backend decisions rank-invariant.
struct Request {
  Op op = Op::kAllReduce;
  TensorView in;
  TensorView out;
  std::variant<Reduce, Exchange, Native> args;
  /// The stream is being captured into a CUDA graph.
  bool capturing = false;
  /// What the call was, for the kernels to check against their peers'. A fallback's inner calls
  /// carry the outer call's tag.
  CallTag tag{};

  /// The primitive, where it is that one; null otherwise.
  [[nodiscard]] const Reduce* reduce() const noexcept { return std::get_if<Reduce>(&args); }
  [[nodiscard]] const Exchange* exchange() const noexcept { return std::get_if<Exchange>(&args); }
  [[nodiscard]] const Native* native() const noexcept { return std::get_if<Native>(&args); }
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

  // ---- NOTE [backend hooks] -----------------------------------------------------------------
  // What the group asks of every backend of its chain besides its calls: its health, its part
  // of an abort, warm-up, capture scopes, checks, preparation and tuning. The group holds no
  // backend of a concrete type; each hook's default is a backend with nothing to do there.

  /// The owning thread, before each call: kOk, or the failure this backend has seen (sticky),
  /// with what happened in `*message`.
  [[nodiscard]] virtual Status health(std::string* /*message*/) noexcept { return Status::kOk; }
  /// What `health` reads, safe from any thread (the group's watchdog); does not log.
  [[nodiscard]] virtual Status failure(std::string* /*message*/) noexcept { return Status::kOk; }
  /// Makes the backend's work in flight, and to come, give up; `any_thread`: called from another
  /// thread than the owner's (only what is safe there). Idempotent.
  virtual void abort(bool /*any_thread*/) noexcept {}
  /// The owning thread, once the group has failed and its backends are aborted: poisons what the
  /// backend left unfinished, and the output of call `checked` where that is the call whose check
  /// failed (0: none).
  virtual void poison_after_failure(std::uint32_t /*checked*/) noexcept {}
  /// Collective, before a stream's first collective (NOTE [first launch]).
  [[nodiscard]] virtual Status warm_up(Stream /*stream*/) noexcept { return Status::kOk; }
  /// A capture scope opened.
  virtual void begin_capture() noexcept {}
  /// The capture scope closed; `agreed`: every rank captured the same calls, and the hook may be
  /// collective (every rank's is called with the same `agreed`).
  [[nodiscard]] virtual Status end_capture(bool /*agreed*/) noexcept { return Status::kOk; }
  /// Whether the backend's calls check their tag against the peers' themselves (NOTE
  /// [fingerprints]); the group checks an eager call first where one that does not serves it.
  [[nodiscard]] virtual bool checks_calls() const noexcept { return true; }
  /// Collective: checks `tag` against every rank's (kMismatch naming both calls); kUnsupported
  /// where the backend cannot.
  [[nodiscard]] virtual Status check_call(const CallTag& /*tag*/, Stream /*stream*/) noexcept {
    return Status::kUnsupported;
  }
  /// Whether its reductions sum in an order the call's shape alone fixes (NOTE [batch
  /// invariance] in tune/selector.hpp).
  [[nodiscard]] virtual bool batch_invariant() const noexcept { return true; }
  /// The largest all-reduce it serves batch-invariantly, in bytes (0: none), for messages.
  [[nodiscard]] virtual std::int64_t invariant_max_bytes() const noexcept { return 0; }
  /// Collective, not graph-safe: readies the backend for exchanges of up to `bytes` bytes of all
  /// ranks' inputs together (`Group::prepare_exchange`). Throws `Error` on failure.
  virtual void prepare(std::int64_t /*bytes*/, Stream /*stream*/) {}
  /// Collective: the backend's paths measured for `key`; nullopt where it has nothing to tune.
  /// Throws `Error` when a measurement fails.
  [[nodiscard]] virtual std::optional<TuneTable> tune(const TuneKey& /*key*/) {
    return std::nullopt;
  }
};

/// `s`; where it is a failure and `out` is given, with `message()` in `*out` (the status stands
/// without its message when the message cannot be made). For the hooks that report a failure.
template <class F>
[[nodiscard]] Status with_message(Status s, std::string* out, F&& message) noexcept {
  if (s == Status::kOk || out == nullptr) return s;
  try {
    *out = message();
  } catch (...) {  // NOLINT(bugprone-empty-catch): the status stands without its message
  }
  return s;
}

/// Whether some step of `plan` (its own, or one of a composite's inner calls) runs on a backend
/// for which `pred` is true.
template <class Pred>
[[nodiscard]] bool any_step(const Plan& plan, Pred pred) noexcept {
  if (plan.step.backend != nullptr && pred(*plan.step.backend)) return true;
  for (const Step& s : plan.inner)
    if (s.backend != nullptr && pred(*s.backend)) return true;
  return false;
}

/// For a deterministic group (NOTE [batch invariance] in tune/selector.hpp): empty when `req`,
/// planned as `plan`, is batch-invariant — no `Reduce` but a plain reduce-scatter's, or one whose
/// every step runs on a `Backend::batch_invariant` backend —,
/// else why not, naming the call's size, its path and `invariant_max_bytes`, the largest
/// all-reduce the group serves batch-invariantly (0: none). Pure.
[[nodiscard]] std::string not_batch_invariant(const Request& req, const Plan& plan,
                                              std::int64_t invariant_max_bytes);

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

  /// Calls `f(Backend&)` on every backend, in order (NOTE [backend hooks]).
  template <class F>
  void each(F&& f) const {
    for (const auto& b : backends_) f(*b);
  }

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
