// SPDX-License-Identifier: Apache-2.0
// The state of a `Group` and the one path every collective call takes through it: health, then
// the operation's checks (ops/), then one plan of the backend chain, then its run. Internal to
// the coordinator (group.cpp, group_ops.cpp, group_setup.cpp).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "bootstrap/rank_watch.hpp"
#include "coordinator/watchdog.hpp"
#include "ops/call.hpp"
#include "ops/exchange.hpp"
#include "tpcomm/group.hpp"
#include "tune/table.hpp"

namespace tpcomm {

struct Peers;

struct Group::Impl {
  Bootstrap boot;  // the group's own namespace in the store
  int device = 0;
  Options options;
  BackendChain chain;
  // The backend that checks an eager call before one that does not check its calls serves it
  // (the custom kernels' barrier; `Options::nccl_check`), and whose tuned table the group loads;
  // null without the custom kernels. Every other use of a backend goes through the chain's
  // hooks (NOTE [backend hooks]).
  Backend* custom = nullptr;
  // A backend that can fail on its own (the custom kernels, NCCL): the watchdog watches it.
  bool watched = false;
  std::optional<TuneTable> table_storage;
  const TuneTable* table = nullptr;
  TuneKey tune_key;
  Status health = Status::kOk;
  std::string last_error;
  Stream last_stream = nullptr;
  bool any_call = false;
  cudaEvent_t order_event = nullptr;
  bool scope_open = false;
  // An abort asked for from any thread: `abort()`, or the store client's watching thread when
  // a member is gone (NOTE [rank watch]). The owning thread acts on it in `poll_health`.
  std::shared_ptr<RankWatch> rank_watch;
  std::uint64_t watch_id = 0;
  std::atomic<bool> abort_requested{false};
  std::atomic<bool> aborted_by_user{false};  // `Group::abort()`: not a failure to act on
  std::mutex abort_mu;
  std::string abort_reason;                // guarded by abort_mu; the first request's
  Status abort_status = Status::kAborted;  // guarded by abort_mu; the first request's
  // Collective calls made so far (NOTE [fingerprints]): every rank counts the same calls.
  std::uint32_t calls = 0;
  // A deterministic group said once that a call of it is not batch-invariant.
  bool said_not_invariant = false;
  // The calls captured in the open capture scope, compared across ranks when it closes.
  std::vector<CallTag> captured;
  std::optional<Watchdog> watchdog;  // NOTE [watchdog]; stopped first in ~Impl

  explicit Impl(Bootstrap b) : boot(std::move(b)) {}
  ~Impl();

  /// What the operations' checks need (ops/call.hpp).
  [[nodiscard]] GroupShape shape() const noexcept {
    return GroupShape{boot.world_size(), boot.rank(), device};
  }

  // ---- group_setup.cpp: building the chain --------------------------------------------------
  Peers meet_peers(bool want_nccl, std::string* nccl_why);
  void add_custom(Pinned pinned, const GroupConfig& config);
  void add_nccl(const Peers& peers, const std::string& nccl_why);
  void add_composites();
  void load_tune_table(const Peers& peers);
  void watch_members();
  void start_watchdog();

  // ---- group.cpp: the path of every call ----------------------------------------------------
  /// A checked call (`checked` is what its operation's checks returned): health, then the plan,
  /// then its run (`run`).
  Status call(Status checked, Call& c, Stream stream) noexcept;
  /// Plans `req` once and runs the plan, after the stream's warm-up and ordering.
  Status run(Request& req, Stream stream) noexcept;
  /// The path `req` would take, in words (pure).
  [[nodiscard]] std::string describe(const Request& req) const {
    return BackendChain::describe(chain.plan(req));
  }
  Status fail(Status s, std::string message) noexcept;
  [[nodiscard]] bool checks_before_nccl(const Request& req, const Plan& plan) const noexcept;
  Status check_invariant(const Request& req, const Plan& plan) noexcept;
  Status fail_on(Status s, const char* what) noexcept;
  Status poll_health() noexcept;
  /// Every backend's `abort` hook (NOTE [backend hooks]) but `except`'s.
  void abort_backends(bool any_thread, const Backend* except = nullptr) noexcept;
  Status order(Stream stream) noexcept;
  [[nodiscard]] bool capturing(Stream stream) const noexcept;
  Status warm_up(Stream stream) noexcept;
  Status compare_captured() noexcept;
  void request_abort(std::string reason, Status status = Status::kAborted) noexcept;
  std::optional<Watchdog::Failure> watched_failure() noexcept;
};

}  // namespace tpcomm
