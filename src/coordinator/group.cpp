// SPDX-License-Identifier: Apache-2.0
// Group: the one path of every collective call (health, checks, one plan, its run), the group's
// health and failures, and its capture scopes (docs/DESIGN.md). Building the group is in
// group_setup.cpp, the operations' entry points in group_ops.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "backends/fingerprint.hpp"
#include "coordinator/group_impl.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "tpcomm/group.hpp"
#include "tune/algorithms.hpp"

namespace tpcomm {

Group::Impl::~Impl() {
  watchdog.reset();
  if (rank_watch) rank_watch->unsubscribe(watch_id);
  // A communicator waiting for a rank that is gone is aborted, not finalised at a deadline.
  if (abort_requested.load()) abort_backends(true);
  if (order_event != nullptr) cudaEventDestroy(order_event);
}

Status Group::Impl::call(Status checked, Call& c, Stream stream) noexcept {
  TPCOMM_TRY(poll_health());
  if (checked != Status::kOk) return fail(checked, std::move(c.message));
  if (c.empty) return Status::kOk;
  return run(c.request, stream);
}

Status Group::Impl::run(Request& req, Stream stream) noexcept {
  // Point-to-point calls involve two ranks: the others would never meet the barrier, and they
  // are not numbered (NOTE [fingerprints]).
  const Native* native = req.native();
  const bool collective = native == nullptr || native->kind == Native::Kind::kBroadcast;
  // Planned first, so that a call refused here launches nothing and counts as no call.
  req.capturing = capturing(stream);
  const Plan plan = chain.plan(req);
  TPCOMM_TRY(check_invariant(req, plan));
  if (collective) {
    TPCOMM_TRY(warm_up(stream));
    req.tag.call = ++calls;
  }
  TPCOMM_TRY(order(stream));
  if (req.capturing && collective) captured.push_back(req.tag);
  if (collective && checks_before_nccl(req, plan))
    TPCOMM_TRY(fail_on(custom->check_call(req.tag, stream), "checking a call before NCCL"));
  const Backend* served = nullptr;
  const Status s = chain.run(req, plan, stream, &served);
  if (s == Status::kOk) return s;
  if (s == Status::kUnsupported && served == nullptr)
    return fail(s, detail::concat(to_string(req.op), ": no backend can serve ", req.in.numel(), " ",
                                  to_string(req.in.dtype), " elements",
                                  req.reduce() != nullptr
                                      ? detail::concat(" (", to_string(req.reduce()->op), ")")
                                      : std::string()));
  std::string message = served != nullptr ? served->last_error() : std::string();
  if (message.empty())
    message = detail::concat(to_string(req.op), " on ", served ? served->name() : "?",
                             " failed: ", to_string(s));
  TPCOMM_LOG_ERROR("rank ", boot.rank(), ": ", message);
  return fail(s, std::move(message));
}

/// Whether `req`, planned as `plan`, is an eager call that a backend which does not check its
/// calls (NCCL) serves, and `Options::nccl_check` wants checked first (the same answer on every
/// rank: the plan, the size and the knob are).
bool Group::Impl::checks_before_nccl(const Request& req, const Plan& plan) const noexcept {
  if (custom == nullptr || req.capturing || options.nccl_check == Switch::kOff) return false;
  if (!any_step(plan, [](const Backend& b) { return !b.checks_calls(); })) return false;
  return options.nccl_check == Switch::kOn ||
         std::max(req.in.nbytes(), req.out.nbytes()) >= Options::kNcclCheckMinBytes;
}

/// In a deterministic group (NOTE [batch invariance] in tune/selector.hpp), an all-reduce, fused
/// norm or MoE finalize that a backend which is not batch-invariant (NCCL) reduces in a step of
/// its plan (`not_batch_invariant`): logged once, or, strict, refused before anything is
/// launched. The same on every rank: the plan and the knob are.
Status Group::Impl::check_invariant(const Request& req, const Plan& plan) noexcept {
  // One rank has nothing to sum: NCCL's copy (TPCOMM_ALGO=nccl) is as invariant as any.
  if (options.deterministic == Determinism::kOff || boot.world_size() == 1) return Status::kOk;
  std::int64_t limit = 0;
  chain.each([&](const Backend& b) { limit = std::max(limit, b.invariant_max_bytes()); });
  std::string why = not_batch_invariant(req, plan, limit);
  if (why.empty()) return Status::kOk;
  if (options.deterministic == Determinism::kStrict)
    return fail(Status::kInvalidArgument, detail::concat("TPCOMM_DETERMINISTIC=strict: ", why));
  if (!std::exchange(said_not_invariant, true) && boot.rank() == 0)
    TPCOMM_LOG_WARN("deterministic group: ", why, " (said once per group)");
  return Status::kOk;
}

/// `s` as a failure of the group, named `what` where the backend said nothing.
Status Group::Impl::fail_on(Status s, const char* what) noexcept {
  if (s == Status::kOk) return s;
  std::string message = custom != nullptr ? custom->last_error() : std::string();
  return fail(s, message.empty() ? detail::concat(what, ": ", to_string(s)) : std::move(message));
}

Status Group::Impl::fail(Status s, std::string message) noexcept {
  last_error = std::move(message);
  if (s == Status::kTimeout || s == Status::kAborted || s == Status::kNcclError ||
      s == Status::kCudaError || s == Status::kInternal || s == Status::kMismatch)
    health = s;
  return s;
}

/// The backends' failures (the custom kernels report theirs through host memory): noticed on
/// every call, whatever backend that call goes to. A failure of one aborts the others (NCCL's
/// kernels enqueued behind it return, a call whose check failed among them), and the outputs an
/// eager call left unfinished are poisoned, here, on the thread that made the call, behind it on
/// its stream.
Status Group::Impl::poll_health() noexcept {
  if (health != Status::kOk) return health;
  if (abort_requested.load(std::memory_order_acquire)) {
    std::string why;
    Status status = Status::kAborted;
    {
      std::lock_guard lock(abort_mu);
      why = abort_reason;
      status = abort_status;
    }
    abort_backends(false);
    const std::uint32_t checked = status == Status::kMismatch ? calls : 0;
    chain.each([&](Backend& b) { b.poison_after_failure(checked); });
    TPCOMM_LOG_ERROR("group rank ", boot.rank(), ": ", why, "; the group is aborted");
    return fail(status, std::move(why));
  }
  Status failed = Status::kOk;
  std::string message;
  const Backend* source = nullptr;
  chain.each([&](Backend& b) {
    if (failed != Status::kOk) return;
    failed = b.health(&message);
    source = &b;
  });
  if (failed == Status::kOk) return Status::kOk;
  abort_backends(false, source);
  const std::uint32_t checked = failed == Status::kMismatch ? calls : 0;
  chain.each([&](Backend& b) { b.poison_after_failure(checked); });
  return fail(failed, std::move(message));
}

void Group::Impl::abort_backends(bool any_thread, const Backend* except) noexcept {
  chain.each([&](Backend& b) {
    if (&b != except) b.abort(any_thread);
  });
}

/// A group serves one operation at a time: a call on a new stream waits for the last one.
Status Group::Impl::order(Stream stream) noexcept {
  if (any_call && stream != last_stream && !scope_open) {
    if (order_event == nullptr)
      TPCOMM_CUDA_TRY(cudaEventCreateWithFlags(&order_event, cudaEventDisableTiming));
    TPCOMM_CUDA_TRY(cudaEventRecord(order_event, reinterpret_cast<cudaStream_t>(last_stream)));
    TPCOMM_CUDA_TRY(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), order_event, 0));
  }
  any_call = true;
  last_stream = stream;
  return Status::kOk;
}

bool Group::Impl::capturing(Stream stream) const noexcept {
  if (!scope_open) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &st) == cudaSuccess &&
         st == cudaStreamCaptureStatusActive;
}

/// NOTE [first launch] (backends/custom_ar.cpp): a stream's first collective warms it up.
Status Group::Impl::warm_up(Stream stream) noexcept {
  Status s = Status::kOk;
  std::string message;
  chain.each([&](Backend& b) {
    if (s != Status::kOk) return;
    s = b.warm_up(stream);
    if (s != Status::kOk) message = b.last_error();
  });
  if (s == Status::kOk) return s;
  return fail(s, message.empty() ? detail::concat("warming up a stream failed: ", to_string(s))
                                 : std::move(message));
}

/// Collective, when a capture scope closes: the ranks' captured calls must be the same calls
/// (NOTE [fingerprints]), or the graphs would meet mismatched peers at every replay. kMismatch
/// on every rank alike, naming the first call that differs.
Status Group::Impl::compare_captured() noexcept {
  std::vector<std::vector<std::byte>> all;
  try {
    all = boot.all_gather(std::as_bytes(std::span(captured)));
  } catch (const Error& e) {
    return fail(e.status(), detail::concat("closing a capture scope: ", e.what()));
  }
  auto calls_of = [&](int r) {
    const auto& bytes = all[static_cast<std::size_t>(r)];
    std::vector<CallTag> tags(bytes.size() / sizeof(CallTag));
    std::memcpy(tags.data(), bytes.data(), tags.size() * sizeof(CallTag));
    return tags;
  };
  const std::vector<CallTag> first = calls_of(0);
  for (int r = 1; r < boot.world_size(); ++r) {
    const std::vector<CallTag> other = calls_of(r);
    std::size_t i = 0;
    // The same calls with other call numbers: the ranks were out of step before the capture
    // (one skipped or repeated a call), and the graphs would meet other calls at every replay.
    while (i < first.size() && i < other.size() && first[i].fingerprint == other[i].fingerprint &&
           first[i].call == other[i].call)
      ++i;
    if (i == first.size() && i == other.size()) continue;
    auto name = [&](const std::vector<CallTag>& tags) {
      return i < tags.size() ? detail::concat("call ", tags[i].call, " ",
                                              describe_fingerprint(tags[i].fingerprint))
                             : std::string("no call (its capture ended)");
    };
    const bool out_of_step =
        i < first.size() && i < other.size() && first[i].fingerprint == other[i].fingerprint;
    abort_backends(false);
    return fail(Status::kMismatch,
                detail::concat(out_of_step ? "ranks captured calls out of step (one skipped or "
                                             "repeated a call before the capture; captured call "
                                           : "ranks captured different collectives (captured call ",
                               i + 1, " of the scope): rank 0 ", name(first), ", rank ", r, " ",
                               name(other), "; every rank must capture the same calls"));
  }
  return Status::kOk;
}

/// Thread-safe: the custom kernels give up now, the next call on the owning thread fails with
/// `status`.
void Group::Impl::request_abort(std::string reason, Status status) noexcept {
  {
    std::lock_guard lock(abort_mu);
    if (abort_reason.empty()) {
      abort_reason = std::move(reason);
      abort_status = status;
    }
  }
  abort_requested.store(true, std::memory_order_release);
  // The custom kernels give up; NCCL's already enqueued, graph-replayed ones included, return
  // now (NOTE [nccl from two threads] in backends/nccl_comm.cpp).
  abort_backends(true);
}

/// The failure the watchdog acts on, if any (NOTE [watchdog]); thread-safe. A backend's failure
/// first, but a kAborted one while an abort was asked for: that abort (a lost rank, a failure
/// elsewhere) is the news.
std::optional<Watchdog::Failure> Group::Impl::watched_failure() noexcept {
  if (aborted_by_user.load(std::memory_order_acquire)) return std::nullopt;
  std::optional<Watchdog::Failure> found;
  chain.each([&](Backend& b) {
    if (found) return;
    std::string message;
    const Status s = b.failure(&message);
    if (s != Status::kOk &&
        (s != Status::kAborted || !abort_requested.load(std::memory_order_acquire)))
      found = std::pair{s, std::move(message)};
  });
  if (found) return found;
  if (abort_requested.load(std::memory_order_acquire)) {
    std::lock_guard lock(abort_mu);
    return std::pair{abort_status, abort_reason};
  }
  return std::nullopt;
}

Group::~Group() = default;
Group::Group(Group&&) noexcept = default;
Group& Group::operator=(Group&&) noexcept = default;

int Group::rank() const noexcept { return impl_->boot.rank(); }
int Group::world_size() const noexcept { return impl_->boot.world_size(); }
int Group::device() const noexcept { return impl_->device; }
const Options& Group::options() const noexcept { return impl_->options; }
const std::string& Group::last_error() const noexcept { return impl_->last_error; }
std::string Group::tune_table_text() const {
  return impl_->table != nullptr ? impl_->table->to_text() : std::string();
}
std::string Group::tune_file() const { return tune_path(impl_->options, impl_->tune_key); }

Status Group::health() noexcept { return impl_->poll_health(); }

void Group::set_failure_mode(FailureMode mode, FailureHandler handler) {
  if (impl_->watchdog) impl_->watchdog->set_mode(mode, std::move(handler));
}

void Group::abort() noexcept {
  impl_->aborted_by_user.store(true, std::memory_order_release);
  try {
    impl_->request_abort("group aborted");
  } catch (...) {  // NOLINT(bugprone-empty-catch): the reason could not be kept; the flag is set
    impl_->abort_requested.store(true);
  }
}

Status Group::warm_up(Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  return m.warm_up(stream);
}

Group::CaptureScope Group::capture(Stream stream) {
  Impl& m = *impl_;
  TPCOMM_CHECK(!m.scope_open, Status::kInvalidArgument, "capture scopes do not nest");
  if (Status s = m.warm_up(stream); s != Status::kOk)
    TPCOMM_THROW(s, "opening a capture scope: ", m.last_error);
  // The capture will not see work issued earlier on another stream: finish it now.
  if (m.any_call && m.last_stream != stream)
    TPCOMM_CUDA_CHECK(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(m.last_stream)));
  m.any_call = true;
  m.last_stream = stream;
  m.scope_open = true;
  m.chain.each([](Backend& b) { b.begin_capture(); });
  m.captured.clear();
  return CaptureScope(this);
}

Group::CaptureScope::CaptureScope(CaptureScope&& other) noexcept
    : group_(std::exchange(other.group_, nullptr)) {}

Group::CaptureScope::~CaptureScope() {
  if (group_ == nullptr) return;
  if (Status s = close(); s != Status::kOk)
    TPCOMM_LOG_ERROR("closing a capture scope failed: ", group_->last_error());
}

Status Group::CaptureScope::close() noexcept {
  if (group_ == nullptr) return Status::kOk;
  Impl& m = *group_->impl_;
  group_ = nullptr;
  m.scope_open = false;
  const Status agreed = m.compare_captured();
  Status s = Status::kOk;
  std::string message;
  m.chain.each([&](Backend& b) {
    const Status e = b.end_capture(agreed == Status::kOk);
    if (e != Status::kOk && s == Status::kOk) {
      s = e;
      message = b.last_error();
    }
  });
  if (agreed != Status::kOk) {
    TPCOMM_LOG_ERROR("group rank ", m.boot.rank(), ": ", m.last_error);
    return agreed;
  }
  return s == Status::kOk ? s : m.fail(s, std::move(message));
}

void Group::tune() {
  Impl& m = *impl_;
  if (m.custom == nullptr) return;
  std::optional<TuneTable> tuned = m.custom->tune(m.tune_key);
  if (!tuned) return;
  TuneTable& table = *tuned;
  if (m.boot.rank() == 0) {
    const std::string path = tune_path(m.options, m.tune_key);
    table.save(path);
    TPCOMM_LOG_INFO("stored tuned table in ", path);
  }
  m.table_storage = std::move(table);
  m.table = &*m.table_storage;
}

}  // namespace tpcomm
