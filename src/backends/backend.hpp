// SPDX-License-Identifier: Apache-2.0
// A backend serves some collectives; the chain asks each in order (DESIGN.md §3).
#pragma once

#include <atomic>
#include <memory>
#include <string_view>
#include <vector>

#include "kernels/kernels.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

struct ExchangePlan;

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
  kLmHeadExchange
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
  /// Root of a broadcast, peer of a send/recv; -1 otherwise.
  int peer = -1;
  /// The stream is being captured into a CUDA graph.
  bool capturing = false;
  /// kAllReduceAddRmsNorm: the epilogue's arguments (`in` is x, `out` is residual_out).
  const kernels::FusionParams* fusion = nullptr;
  /// kAllToAll with per-peer counts: `counts[s * world + d]` elements go from rank s to rank d
  /// (the same matrix on every rank); nullptr for the equal split.
  const std::int64_t* counts = nullptr;
  /// kAllGather, kAllToAll, kLmHeadExchange: what this rank copies from each rank, when the
  /// group may serve it with the custom kernels (world size 2..8); nullptr otherwise.
  const ExchangePlan* plan = nullptr;
  /// What the call was, for the kernels to check against their peers'. A fallback's inner calls
  /// carry the outer call's tag.
  CallTag tag{};
};

/// A backend's answer to "can you serve this?": `reason` says why not (a static string); `plan`
/// is what the backend decided while answering (the custom backend's algorithm and launch
/// shape), handed back to its `run`, so that a call is decided once.
struct Support {
  const char* reason = nullptr;
  std::uint64_t plan = 0;
  [[nodiscard]] bool ok() const noexcept { return reason == nullptr; }
  static Support yes(std::uint64_t plan = 0) noexcept { return {nullptr, plan}; }
  static Support no(const char* why) noexcept { return {why, 0}; }
};

/// A way to run collectives. `supports` is pure and cheap and depends only on rank-invariant
/// facts (sizes, dtype, shape, group configuration, capture state), never on pointer values.
/// `run` may still return kUnsupported (the chain then asks the next backend); any other
/// status is final.
class Backend {
 public:
  virtual ~Backend() = default;
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  [[nodiscard]] virtual Support supports(const Request& request) const noexcept = 0;
  /// Serves `request`; `support` is what `supports` answered for it.
  [[nodiscard]] virtual Status run(const Request& request, const Support& support,
                                   Stream stream) noexcept = 0;
};

/// The ordered backends of a group. Not thread-safe for `add`; `run`/`select` may be called
/// concurrently with each other.
class BackendChain {
 public:
  void add(std::unique_ptr<Backend> backend);

  /// The first backend whose `supports` says yes (what `run` would try first), or nullptr.
  [[nodiscard]] const Backend* select(const Request& request) const noexcept;

  /// Runs `request` on the first backend that supports it; `kUnsupported` from `run` moves on
  /// to the next one; any other status is returned as is (falling back on a real error hides
  /// bugs and can hang peers). Each (backend, reason) pair of a fallback is logged once.
  /// `served_by`, when given, receives the backend that returned.
  [[nodiscard]] Status run(const Request& request, Stream stream,
                           const Backend** served_by = nullptr) noexcept;

 private:
  void note_fallback(std::size_t index, const char* reason) noexcept;

  std::vector<std::unique_ptr<Backend>> backends_;
  // Reasons already logged per backend; reasons are static strings, compared by address so the
  // hot path never allocates or locks.
  static constexpr int kReasonSlots = 16;
  std::vector<std::unique_ptr<std::atomic<const char*>[]>> logged_;
};

}  // namespace tpcomm
