// SPDX-License-Identifier: Apache-2.0
// Group: builds the backend chain of DESIGN.md §3 and runs collectives through it.
#include "tpcomm/group.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>

#include "backends/backend.hpp"
#include "backends/custom_ar.hpp"
#include "backends/fingerprint.hpp"
#include "backends/nccl_comm.hpp"
#include "backends/nccl_lib.hpp"
#include "bootstrap/agree.hpp"
#include "bootstrap/rank_watch.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "exchange_plan.hpp"
#include "ipc/peer_buffer.hpp"
#include "kernels/kernels.hpp"
#include "norm.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"
#include "watchdog.hpp"

namespace tpcomm {
namespace {

constexpr const char* kFusedOnCustomOnly = "the fused operation runs on the custom kernels only";
constexpr const char* kLmHeadOnCustomOnly = "the LM-head exchange runs on the custom kernels only";

/// World size 1: every collective is a copy (or nothing, in place).
class LocalBackend final : public Backend {
 public:
  std::string_view name() const noexcept override { return "local"; }
  Support supports(const Request& r) const noexcept override {
    if (r.op == Op::kAllReduceAddRmsNorm) return Support::no(kFusedOnCustomOnly);
    if (r.op == Op::kLmHeadExchange) return Support::no(kLmHeadOnCustomOnly);
    return Support::yes();
  }
  Status run(const Request& r, const Support&, Stream stream) noexcept override {
    if (r.op == Op::kSend || r.op == Op::kRecv) return Status::kInvalidArgument;
    if (r.in.data == r.out.data || r.out.nbytes() == 0) return Status::kOk;
    TPCOMM_CUDA_TRY(cudaMemcpyAsync(r.out.data, r.in.data, static_cast<std::size_t>(r.out.nbytes()),
                                    cudaMemcpyDeviceToDevice,
                                    reinterpret_cast<cudaStream_t>(stream)));
    return Status::kOk;
  }
};

/// The custom all-reduce; the selector decides per call which algorithm of the registry serves.
class CustomArBackend final : public Backend {
 public:
  CustomArBackend(std::unique_ptr<CustomAllReduce> ar, Pinned pinned, const TuneTable* const* table)
      : ar_(std::move(ar)), pinned_(pinned), table_(table) {}
  std::string_view name() const noexcept override { return "custom_ar"; }
  CustomAllReduce& impl() noexcept { return *ar_; }

  Choice choose(const Request& r) const noexcept {
    if (r.op == Op::kAllReduceAddRmsNorm)
      return select_add_rmsnorm(r.in.numel() / r.fusion->hidden, r.fusion->hidden, r.in.dtype,
                                ar_->caps(), pinned_, *table_);
    return select_all_reduce(r.in.nbytes(), r.in.dtype, r.reduce, ar_->caps(), pinned_, *table_);
  }
  ExchangeChoice choose_exchange(const Request& r) const noexcept {
    return select_exchange(r.plan->largest_input, r.plan->largest_output, ar_->caps(), pinned_,
                           *table_);
  }
  static bool exchanges(Op op) noexcept {
    return op == Op::kAllGather || op == Op::kAllToAll || op == Op::kLmHeadExchange;
  }
  /// The plan handed from `supports` to `run` is the chosen algorithm and launch shape.
  Support supports(const Request& r) const noexcept override {
    if (exchanges(r.op)) {
      if (r.plan == nullptr) return Support::no("the exchange has no plan");
      const ExchangeChoice c = choose_exchange(r);
      if (c.algo == ExchangeAlgo::kNone)
        return Support::no("input larger than the exchange's staging (Group::prepare_exchange)");
      return Support::yes(static_cast<std::uint64_t>(c.algo) |
                          static_cast<std::uint64_t>(c.blocks) << 8 |
                          static_cast<std::uint64_t>(c.threads) << 32);
    }
    if (r.op == Op::kAllReduceAddRmsNorm) {
      if (const char* why = why_not_fused(r.in.numel() / r.fusion->hidden, r.fusion->hidden,
                                          r.in.dtype, ar_->caps(), pinned_, *table_))
        return Support::no(why);
    } else if (r.op != Op::kAllReduce) {
      return Support::no("only all-reduce");
    }
    const Choice c = choose(r);
    if (c.algo == Algo::kNone) return Support::no("size, dtype or op outside the custom kernels");
    return Support::yes(static_cast<std::uint64_t>(c.algo) |
                        static_cast<std::uint64_t>(c.blocks) << 8 |
                        static_cast<std::uint64_t>(c.threads) << 32);
  }
  Status run(const Request& r, const Support& support, Stream stream) noexcept override {
    const Choice c{static_cast<Algo>(support.plan & 0xFF),
                   static_cast<int>((support.plan >> 8) & 0xFFFFFF),
                   static_cast<int>(support.plan >> 32)};
    if (exchanges(r.op))
      return ar_->exchange(*r.plan, r.in, r.out,
                           ExchangeChoice{static_cast<ExchangeAlgo>(c.algo), c.blocks, c.threads},
                           r.capturing, stream, r.tag);
    return ar_->run(r.in, r.out, c, r.capturing, stream, r.tag, r.fusion);
  }

 private:
  std::unique_ptr<CustomAllReduce> ar_;
  Pinned pinned_;
  const TuneTable* const* table_;
};

/// NCCL: always last, serves everything its dtype table covers.
class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(std::unique_ptr<NcclComm> comm) : comm_(std::move(comm)) {}
  std::string_view name() const noexcept override { return "nccl"; }
  NcclComm& comm() noexcept { return *comm_; }
  Support supports(const Request& r) const noexcept override {
    if (r.op == Op::kAllReduceAddRmsNorm) return Support::no(kFusedOnCustomOnly);
    if (r.op == Op::kLmHeadExchange) return Support::no(kLmHeadOnCustomOnly);
    return Support::yes();
  }
  Status run(const Request& r, const Support&, Stream s) noexcept override {
    const auto n = static_cast<std::size_t>(r.out.numel());
    const int world = comm_->world_size();
    switch (r.op) {
      case Op::kAllReduce:
        return comm_->all_reduce(r.in.data, r.out.data, n, r.in.dtype, r.reduce, s);
      case Op::kAllGather:
        return comm_->all_gather(r.in.data, r.out.data, static_cast<std::size_t>(r.in.numel()),
                                 r.in.dtype, s);
      case Op::kReduceScatter:
        return comm_->reduce_scatter(r.in.data, r.out.data, n, r.in.dtype, r.reduce, s);
      case Op::kAllToAll:
        if (r.counts != nullptr)
          return comm_->all_to_all(r.in.data, r.out.data,
                                   std::span(r.counts, static_cast<std::size_t>(world) *
                                                           static_cast<std::size_t>(world)),
                                   r.in.dtype, s);
        return comm_->all_to_all(r.in.data, r.out.data, n / world, r.in.dtype, s);
      case Op::kBroadcast:
        return comm_->broadcast(r.in.data, r.out.data, n, r.out.dtype, r.peer, s);
      case Op::kSend:
        return comm_->send(r.in.data, static_cast<std::size_t>(r.in.numel()), r.in.dtype, r.peer,
                           s);
      case Op::kRecv:
        return comm_->recv(r.out.data, n, r.out.dtype, r.peer, s);
      case Op::kAllReduceAddRmsNorm:
      case Op::kLmHeadExchange:
        return Status::kUnsupported;
    }
    return Status::kInternal;
  }

 private:
  std::unique_ptr<NcclComm> comm_;
};

/// What every rank tells the others at construction.
struct RankInfo {
  std::uint64_t nonce;
  std::int32_t node;
  std::int32_t device;
  std::array<char, 32> bus_id;
  std::int32_t nccl_loadable;
  std::int32_t nccl_version;
};

bool same_gpu(const RankInfo& a, const RankInfo& b) {
  return a.node == b.node && std::strcmp(a.bus_id.data(), b.bus_id.data()) == 0;
}

/// What the ranks told each other at construction.
struct Peers {
  std::vector<RankInfo> infos;
  /// Every rank runs on this rank's GPU.
  bool one_gpu = true;
  /// The first two ranks that share a GPU, or {-1, -1}.
  std::pair<int, int> shared{-1, -1};
};

/// A namespace of the group's own in `boot`'s store, named by rank 0. Collective.
Bootstrap own_namespace(Bootstrap& boot) {
  std::uint64_t tag = std::random_device{}();
  tag = (tag << 32) ^ std::random_device{}() ^ process_nonce();
  tag = boot.broadcast_value(tag, 0);
  std::vector<int> ranks(static_cast<std::size_t>(boot.world_size()));
  for (int r = 0; r < boot.world_size(); ++r) ranks[static_cast<std::size_t>(r)] = r;
  return boot.split(ranks, "group-" + std::to_string(tag));
}

}  // namespace

struct Group::Impl {
  Bootstrap boot;  // the group's own namespace in the store
  int device = 0;
  Options options;
  BackendChain chain;
  CustomArBackend* custom = nullptr;
  NcclBackend* nccl = nullptr;
  std::optional<TuneTable> table_storage;
  const TuneTable* table = nullptr;
  TuneKey tune_key;
  Status health = Status::kOk;
  std::string last_error;
  Stream last_stream = nullptr;
  bool any_call = false;
  cudaEvent_t order_event = nullptr;
  bool scope_open = false;
  bool nccl_was_enabled = true;               // NCCL's state before the capture scope enabled it
  std::vector<const char*> fallbacks_logged;  // static strings
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
  // The calls captured in the open capture scope, compared across ranks when it closes.
  std::vector<CallTag> captured;
  std::optional<Watchdog> watchdog;  // NOTE [watchdog]; stopped first in ~Impl

  explicit Impl(Bootstrap b) : boot(std::move(b)) {}
  ~Impl() {
    watchdog.reset();
    if (rank_watch) rank_watch->unsubscribe(watch_id);
    // A communicator waiting for a rank that is gone is aborted, not finalised at a deadline.
    if (abort_requested.load() && nccl != nullptr) nccl->comm().abort();
    if (order_event != nullptr) cudaEventDestroy(order_event);
  }

  /// Subscribes to the store's news of lost ranks: a lost member (or the store's host) makes
  /// the kernels give up at once and the next call fail (`poll_health`).
  void watch_members() {
    if (!options.rank_watch) return;
    rank_watch = boot.shared_store()->rank_watch();
    if (!rank_watch) return;
    std::vector<int> members(static_cast<std::size_t>(boot.world_size()));
    for (int r = 0; r < boot.world_size(); ++r)
      members[static_cast<std::size_t>(r)] = boot.job_rank(r);
    watch_id = rank_watch->subscribe([this, members](int lost, const std::string& reason) {
      const auto it = std::find(members.begin(), members.end(), lost);
      if (lost >= 0 && it == members.end()) return;
      const auto group_rank = it - members.begin();
      request_abort(lost < 0 || group_rank == lost
                        ? reason
                        : detail::concat(reason, " (rank ", group_rank, " of this group)"));
    });
  }

  /// Thread-safe: the custom kernels give up now, the next call on the owning thread fails with
  /// `status`.
  void request_abort(std::string reason, Status status = Status::kAborted) noexcept {
    {
      std::lock_guard lock(abort_mu);
      if (abort_reason.empty()) {
        abort_reason = std::move(reason);
        abort_status = status;
      }
    }
    abort_requested.store(true, std::memory_order_release);
    if (custom != nullptr) custom->impl().abort_kernels();
  }

  /// The failure the watchdog acts on, if any (NOTE [watchdog]); thread-safe.
  std::optional<Watchdog::Failure> watched_failure() noexcept {
    if (aborted_by_user.load(std::memory_order_acquire)) return std::nullopt;
    if (custom != nullptr) {
      std::string message;
      if (Status s = custom->impl().kernel_failure(&message); s != Status::kOk) {
        // A kernel that gave up because of the rank watch's abort: the lost rank is the news.
        if (s != Status::kAborted || !abort_requested.load(std::memory_order_acquire))
          return std::pair{s, std::move(message)};
      }
    }
    if (abort_requested.load(std::memory_order_acquire)) {
      std::lock_guard lock(abort_mu);
      return std::pair{abort_status, abort_reason};
    }
    return std::nullopt;
  }

  void start_watchdog() {
    if (custom == nullptr && !rank_watch) return;
    watchdog.emplace(
        detail::concat("group of ", boot.world_size(), " ranks, rank ", boot.rank(), " (device ",
                       device, ")"),
        options.failure_mode, [this] { return watched_failure(); },
        [this](const Watchdog::Failure& f) { request_abort(f.second, f.first); });
  }

  /// The tag of a new collective call (NOTE [fingerprints]).
  CallTag tag(Op op, DType dtype, std::int64_t count, std::uint32_t shape = 0) noexcept {
    return CallTag{fingerprint(op, dtype, count, shape), ++calls};
  }

  Status fail(Status s, std::string message) noexcept {
    last_error = std::move(message);
    if (s == Status::kTimeout || s == Status::kAborted || s == Status::kNcclError ||
        s == Status::kCudaError || s == Status::kInternal || s == Status::kMismatch)
      health = s;
    return s;
  }

  /// The custom kernels report failures through host memory; notice them on every call, whatever
  /// backend that call goes to.
  Status poll_health() noexcept {
    if (health != Status::kOk) return health;
    if (abort_requested.load(std::memory_order_acquire)) {
      std::string why;
      Status status = Status::kAborted;
      {
        std::lock_guard lock(abort_mu);
        why = abort_reason;
        status = abort_status;
      }
      if (custom != nullptr) custom->impl().abort();
      if (nccl != nullptr) nccl->comm().abort();
      TPCOMM_LOG_ERROR("group rank ", boot.rank(), ": ", why, "; the group is aborted");
      return fail(status, std::move(why));
    }
    if (custom != nullptr) {
      if (Status h = custom->impl().health(); h != Status::kOk)
        return fail(h, custom->impl().error_message());
    }
    return Status::kOk;
  }

  Status check_view(const TensorView& v, const char* what, const char* op) noexcept {
    if (v.numel() > 0 && v.data == nullptr)
      return fail(Status::kInvalidArgument, detail::concat(op, ": ", what, " is null"));
    if (!v.is_contiguous())
      return fail(Status::kInvalidArgument, detail::concat(op, ": ", what, " is not contiguous"));
    if (v.device >= 0 && v.device != device)
      return fail(Status::kInvalidArgument, detail::concat(op, ": ", what, " is on device ",
                                                           v.device, ", the group on ", device));
    return Status::kOk;
  }

  /// Shape rules shared by every collective: `out` holds `out_factor` x and `in` holds
  /// `in_factor` x some common number of elements, with one dtype.
  Status check_pair(const TensorView& in, const TensorView& out, std::int64_t in_factor,
                    std::int64_t out_factor, const char* op) noexcept {
    TPCOMM_TRY(check_view(in, "input", op));
    TPCOMM_TRY(check_view(out, "output", op));
    if (in.dtype != out.dtype)
      return fail(Status::kInvalidArgument, detail::concat(op, ": input is ", to_string(in.dtype),
                                                           ", output is ", to_string(out.dtype)));
    if (in.numel() * out_factor != out.numel() * in_factor)
      return fail(
          Status::kInvalidArgument,
          detail::concat(op, ": output has ", out.numel(), " elements, expected ",
                         in.numel() * out_factor / in_factor, " for an input of ", in.numel()));
    return Status::kOk;
  }

  /// A group serves one operation at a time: a call on a new stream waits for the last one.
  Status order(Stream stream) noexcept {
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

  bool capturing(Stream stream) const noexcept {
    if (!scope_open) return false;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &st) == cudaSuccess &&
           st == cudaStreamCaptureStatusActive;
  }

  /// NOTE [first launch] (backends/custom_ar.cpp): a stream's first collective warms it up.
  Status warm_up(Stream stream) noexcept {
    if (custom == nullptr) return Status::kOk;
    if (Status s = custom->impl().warm_up(stream); s != Status::kOk)
      return fail(s, custom->impl().error_message().empty()
                         ? detail::concat("warming up a stream failed: ", to_string(s))
                         : custom->impl().error_message());
    return Status::kOk;
  }

  Status dispatch(Request req, Stream stream) noexcept {
    // Point-to-point calls involve two ranks: the others would never meet the barrier.
    if (req.op != Op::kSend && req.op != Op::kRecv) TPCOMM_TRY(warm_up(stream));
    TPCOMM_TRY(order(stream));
    req.capturing = capturing(stream);
    if (req.capturing && req.tag.call != 0 &&
        (captured.empty() || captured.back().call != req.tag.call))
      captured.push_back(req.tag);
    const Backend* served = nullptr;
    Status s = chain.run(req, stream, &served);
    if (s == Status::kOk) return s;
    if (s == Status::kUnsupported)
      return fail(
          s, detail::concat(to_string(req.op), ": no backend can serve ", req.in.numel(), " ",
                            to_string(req.in.dtype), " elements (", to_string(req.reduce), ")"));
    std::string message = detail::concat(to_string(req.op), " on ", served ? served->name() : "?",
                                         " failed: ", to_string(s));
    if (served == custom && custom != nullptr && !custom->impl().error_message().empty())
      message = custom->impl().error_message();
    if (served == nccl && nccl != nullptr && !nccl->comm().last_error().empty())
      message = nccl->comm().last_error();
    TPCOMM_LOG_ERROR("rank ", boot.rank(), ": ", message);
    return fail(s, std::move(message));
  }

  /// The fused operation where no fused kernel serves it: the group's all-reduce into an output
  /// that can hold the sum, then the local kernel. Which output holds it is a local choice, but
  /// every rank runs the same all-reduce (same size, dtype and op), so paths still agree.
  Status add_rmsnorm_fallback(const AddRmsNormCall& c, const CallTag& tag, Stream stream) noexcept {
    // As `dispatch` does, before the first kernel of this call.
    TPCOMM_TRY(warm_up(stream));
    TPCOMM_TRY(order(stream));
    const std::int64_t count = c.x.numel();
    kernels::FusionParams f = c.fusion;
    auto reduce = [&](const TensorView& in, const TensorView& out) {
      Request req{Op::kAllReduce, in, out, ReduceOp::kSum, -1, false};
      req.tag = tag;
      return dispatch(req, stream);
    };
    auto local = [&](const void* sum) -> Status {
      if (Status s =
              kernels::launch_add_rmsnorm(sum, c.residual_out.data, f, count, c.dtype, stream);
          s != Status::kOk)
        return fail(s, detail::concat("all_reduce_add_rmsnorm: the local add + RMSNorm failed: ",
                                      to_string(s)));
      return Status::kOk;
    };
    // The sum goes where it destroys nothing the local kernel still needs.
    TensorView sum = c.norm_out;
    if (c.norm_out.dtype == c.dtype && !overlaps(c.norm_out, c.residual)) {
      TPCOMM_TRY(reduce(c.x, sum));
      return local(sum.data);
    }
    if (!overlaps(c.residual_out, c.residual)) {
      sum = c.residual_out;
      TPCOMM_TRY(reduce(c.x, sum));
      return local(sum.data);
    }
    // f8e4m3 norm_out and residual_out == residual: rank 0 adds the residual (the same on every
    // rank) into residual_out, the others put x there, and the all-reduce sums that in place.
    if (boot.rank() == 0) {
      kernels::FusionParams add = f;
      add.kind = kernels::Fusion::kAdd;
      if (Status s = kernels::launch_add_rmsnorm(c.x.data, c.residual_out.data, add, count, c.dtype,
                                                 stream);
          s != Status::kOk)
        return fail(s, "all_reduce_add_rmsnorm: the local residual add failed");
    } else {
      TPCOMM_CUDA_TRY(
          cudaMemcpyAsync(c.residual_out.data, c.x.data, static_cast<std::size_t>(c.x.nbytes()),
                          cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(stream)));
    }
    TPCOMM_TRY(reduce(c.residual_out, c.residual_out));
    f.residual = nullptr;  // added already
    return local(c.residual_out.data);
  }

  /// Collective, when a capture scope closes: the ranks' captured calls must be the same calls
  /// (NOTE [fingerprints]), or the graphs would meet mismatched peers at every replay. kMismatch
  /// on every rank alike, naming the first call that differs.
  Status compare_captured() noexcept {
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
      while (i < first.size() && i < other.size() && first[i].fingerprint == other[i].fingerprint)
        ++i;
      if (i == first.size() && i == other.size()) continue;
      auto name = [&](const std::vector<CallTag>& tags) {
        return i < tags.size() ? describe_fingerprint(tags[i].fingerprint)
                               : std::string("no call (its capture ended)");
      };
      if (custom != nullptr) custom->impl().abort();
      return fail(Status::kMismatch,
                  detail::concat("ranks captured different collectives (captured call ", i + 1,
                                 " of the scope): rank 0 ", name(first), ", rank ", r, " ",
                                 name(other), "; every rank must capture the same calls"));
    }
    return Status::kOk;
  }

  /// Logs once per reason (a static string) why a call takes its fallback, `what`.
  void note_fallback(const char* what, const char* why) noexcept {
    for (const char* seen : fallbacks_logged)
      if (seen == why) return;
    if (fallbacks_logged.size() < 32) fallbacks_logged.push_back(why);
    if (boot.rank() == 0) TPCOMM_LOG_INFO(what, " (", why, ")");
  }

  /// The name of the backend that would serve an exchange request (pure).
  std::string exchange_backend(const Request& req) const noexcept {
    const Backend* b = chain.select(req);
    if (b == nullptr) return "none";
    if (b == custom)
      return "custom_ar:" + std::string(to_string(custom->choose_exchange(req).algo));
    return std::string(b->name());
  }

  /// Why `lm_head_exchange` takes its fallback (a static string), or nullptr when the custom
  /// exchange serves `req` (whose plan this fills). Rank-invariant inputs only.
  const char* lm_head_fallback(Request& req, ExchangePlan& plan, const LmHeadLayout& layout,
                               std::int64_t shard_cols, std::int64_t vocab) const noexcept {
    if (options.lm_head_a2a == Switch::kOff) return "TPCOMM_LM_HEAD_A2A=0";
    const int world = boot.world_size();
    if (world == 1) return "world size 1";
    if (custom == nullptr) return "no custom kernels in this group";
    plan = plan_lm_head(layout, shard_cols, vocab, dtype_size(req.in.dtype), world, boot.rank());
    req.plan = &plan;
    return custom->supports(req).reason;
  }

  /// The LM-head exchange where the custom exchange does not serve: the shards all-gathered
  /// into a stream-ordered temporary ([world, T, S]), then this rank's rows of each shard
  /// copied into its columns. Every rank runs the same all-gather, so paths agree.
  Status lm_head_by_all_gather(const TensorView& shards, const TensorView& out,
                               const LmHeadLayout& layout, const CallTag& tag,
                               Stream stream) noexcept {
    TPCOMM_TRY(warm_up(stream));
    TPCOMM_TRY(order(stream));
    const int world = boot.world_size();
    const auto s = reinterpret_cast<cudaStream_t>(stream);
    const std::int64_t cols = shards.shape[1];
    const std::int64_t vocab = out.shape[1];
    const auto elem = static_cast<std::int64_t>(dtype_size(shards.dtype));
    std::int64_t first = 0;
    for (int r = 0; r < boot.rank(); ++r) first += layout.rows_of(r);
    void* gathered = nullptr;
    TPCOMM_CUDA_TRY(
        cudaMallocAsync(&gathered, static_cast<std::size_t>(world * shards.nbytes()), s));
    const TensorView all = TensorView::flat(gathered, shards.dtype, world * shards.numel(), device);
    Request req{Op::kAllGather, shards.flattened(), all, ReduceOp::kSum, -1, false};
    req.tag = tag;
    ExchangePlan plan;
    if (custom != nullptr) {
      plan = plan_all_gather(shards.nbytes(), world, boot.rank());
      req.plan = &plan;
    }
    Status status = dispatch(req, stream);
    // This rank's rows of every shard into their columns: one launch per kMaxRanks shards.
    const std::int64_t rows = out.shape[0];
    for (int base = 0; base < world && status == Status::kOk && rows > 0; base += kMaxRanks) {
      kernels::RegionCopyParams copy{};
      copy.output = out.data;
      copy.regions = std::min(kMaxRanks, world - base);
      for (int i = 0; i < copy.regions; ++i) {
        const std::int64_t shard = base + i;
        copy.sources[i] = static_cast<const char*>(gathered) + shard * shards.nbytes();
        copy.from[i] = {
            first * cols * elem, cols * elem, shard * cols * elem,
            vocab * elem,        rows,        lm_head_columns(shard, cols, vocab) * elem};
      }
      if (Status c = kernels::launch_region_copy(copy, stream); c != Status::kOk)
        status = fail(c, "lm_head_exchange: copying the local rows failed");
    }
    if (cudaFreeAsync(gathered, s) != cudaSuccess && status == Status::kOk)
      status = fail(Status::kCudaError, "lm_head_exchange: freeing the gathered shards failed");
    return status;
  }

  /// Every rank's `RankInfo`, and what they say about the group's GPUs.
  Peers meet_peers(bool want_nccl, std::string* nccl_why) {
    RankInfo info{};
    info.nonce = process_nonce();
    info.node = boot.node_id();
    info.device = device;
    TPCOMM_CUDA_CHECK(
        cudaDeviceGetPCIBusId(info.bus_id.data(), static_cast<int>(info.bus_id.size()), device));
    if (want_nccl) {
      try {
        info.nccl_version = NcclLib::load(options.nccl_path).version();
        info.nccl_loadable = 1;
      } catch (const Error& e) {
        *nccl_why = e.what();
      }
    }
    Peers peers;
    peers.infos = boot.all_gather_value(info);
    const int world = boot.world_size();
    for (int r = 0; r < world; ++r) {
      const RankInfo& o = peers.infos[static_cast<std::size_t>(r)];
      if (!same_gpu(o, info)) peers.one_gpu = false;
      for (int q = 0; q < r && peers.shared.first < 0; ++q)
        if (same_gpu(peers.infos[static_cast<std::size_t>(q)], o)) peers.shared = {q, r};
    }
    return peers;
  }

  /// The custom all-reduce, where every rank can take part (it votes); a log line otherwise.
  void add_custom(Pinned pinned, const GroupConfig& config) {
    std::string why;
    Options custom_options = options;
    if (!config.fusion) custom_options.lamport_max_bytes = 0;  // no fusion workspace
    if (config.fusion_max_tokens >= 0) custom_options.fusion_max_tokens = config.fusion_max_tokens;
    if (config.fusion_hidden > 0) custom_options.fusion_hidden = config.fusion_hidden;
    if (auto ar = CustomAllReduce::create(boot, device, custom_options, &why)) {
      auto backend = std::make_unique<CustomArBackend>(std::move(ar), pinned, &table);
      custom = backend.get();
      chain.add(std::move(backend));
    } else if (boot.rank() == 0) {
      TPCOMM_LOG_WARN("custom all-reduce not used: ", why);
    }
  }

  /// NCCL, unless a rank cannot load it or two ranks share a GPU (which NCCL refuses).
  void add_nccl(const Peers& peers, const std::string& nccl_why) {
    int missing = -1;
    for (int r = 0; r < boot.world_size() && missing < 0; ++r)
      if (peers.infos[static_cast<std::size_t>(r)].nccl_loadable == 0) missing = r;
    if (missing >= 0) {
      if (boot.rank() == 0 || missing == boot.rank())
        TPCOMM_LOG_WARN("NCCL not used: rank ", missing, " cannot load it",
                        nccl_why.empty() ? std::string() : ": " + nccl_why);
    } else if (peers.shared.first >= 0) {
      if (boot.rank() == 0)
        TPCOMM_LOG_WARN("NCCL not used: ranks ", peers.shared.first, " and ", peers.shared.second,
                        " share one GPU, which NCCL refuses");
    } else {
      auto backend =
          std::make_unique<NcclBackend>(std::make_unique<NcclComm>(boot, device, options));
      nccl = backend.get();
      chain.add(std::move(backend));
    }
  }

  /// The tuned table for this group's key: rank 0 reads the cache, every rank installs what it
  /// read, so all decide alike.
  void load_tune_table(const Peers& peers) {
    cudaDeviceProp prop{};
    TPCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    int driver = 0;
    cudaDriverGetVersion(&driver);
    tune_key = TuneKey{};
    tune_key.gpu = prop.name;
    tune_key.world_size = boot.world_size();
    tune_key.topology = peers.one_gpu ? "one-gpu" : "p2p";
    tune_key.driver_version = driver;
    tune_key.nccl_version = peers.infos[0].nccl_version;
    tune_key.tpcomm_version = TPCOMM_VERSION;
    std::string text;
    const std::string path = tune_path(options, tune_key);
    if (boot.rank() == 0) {
      std::string why;
      if (auto t = TuneTable::load(path, tune_key, &why)) {
        text = t->to_text();
        TPCOMM_LOG_INFO("using tuned table ", path);
      } else {
        TPCOMM_LOG_INFO("no tuned table (", why, "); built-in thresholds decide");
      }
    }
    auto shared = boot.broadcast(std::as_bytes(std::span(text.data(), text.size())), 0);
    if (!shared.empty()) {
      table_storage = TuneTable::parse(
          std::string_view(reinterpret_cast<const char*>(shared.data()), shared.size()));
      table = &*table_storage;
    }
  }
};

namespace {

/// Collective: throws kInvalidArgument on every rank, naming each setting and the ranks with each
/// value, unless every rank holds the same settings that decide which path a call takes or how
/// the ranks' shared buffers are laid out. Ranks that differ there would wait for each other
/// until their deadline, or read each other's buffers at the wrong places.
void require_same_settings(Bootstrap& boot, const Options& o, const GroupConfig& c) {
  auto flag = [](bool b) { return std::string(b ? "1" : "0"); };
  const Setting settings[] = {
      {"TPCOMM_ALGO", o.algo},
      {"TPCOMM_CUSTOM_AR_MAX_BYTES", std::to_string(o.custom_ar_max_bytes)},
      {"TPCOMM_CUSTOM_AR_REGISTER_BYTES", std::to_string(o.custom_ar_register_min_bytes)},
      {"TPCOMM_LAMPORT_MAX_BYTES", std::to_string(o.lamport_max_bytes)},
      {"TPCOMM_FUSION_MAX_TOKENS (or GroupConfig::fusion_max_tokens)",
       std::to_string(c.fusion_max_tokens >= 0 ? c.fusion_max_tokens : o.fusion_max_tokens)},
      {"TPCOMM_FUSION_HIDDEN (or GroupConfig::fusion_hidden)",
       std::to_string(c.fusion_hidden > 0 ? c.fusion_hidden : o.fusion_hidden)},
      {"TPCOMM_DISABLE_CUSTOM_AR", flag(o.disable_custom_ar)},
      {"TPCOMM_DISABLE_NCCL", flag(o.disable_nccl)},
      {"TPCOMM_LM_HEAD_A2A", std::string(to_string(o.lm_head_a2a))},
      {"GroupConfig::custom_all_reduce", flag(c.custom_all_reduce)},
      {"GroupConfig::nccl", flag(c.nccl)},
      {"GroupConfig::fusion", flag(c.fusion)},
  };
  const std::string why = disagreements(boot, settings);
  TPCOMM_CHECK(why.empty(), Status::kInvalidArgument,
               "the ranks' settings differ where they must match (set them alike on every rank):\n",
               why);
}

}  // namespace

Group::Group(Bootstrap& boot, int device, Options options, GroupConfig config) {
  Pinned pinned;
  TPCOMM_CHECK(parse_pinned(options.algo, &pinned), Status::kInvalidArgument, "algorithm \"",
               options.algo, "\" (TPCOMM_ALGO) is not one of ", pinned_names());
  options.algo = std::string(to_string(pinned));
  TPCOMM_CHECK(config.fusion_max_tokens >= -1 && config.fusion_max_tokens <= 65536 &&
                   config.fusion_hidden >= 0 && config.fusion_hidden <= 65536,
               Status::kInvalidArgument, "GroupConfig: fusion_max_tokens ",
               config.fusion_max_tokens, " (wanted -1 to 65536) or fusion_hidden ",
               config.fusion_hidden, " (wanted 0 to 65536) out of range");
  impl_ = std::make_unique<Impl>(own_namespace(boot));
  Impl& m = *impl_;
  m.device = device;
  m.options = std::move(options);
  require_same_settings(m.boot, m.options, config);
  DeviceGuard guard(device);
  // TPCOMM_ALGO=nccl means NCCL for everything, even at world size 1 (to measure it).
  const bool nccl_only = pinned == Algo::kNone;
  const int world = m.boot.world_size();
  const bool want_nccl = config.nccl && !m.options.disable_nccl && (world > 1 || nccl_only);
  std::string nccl_why;
  const Peers peers = m.meet_peers(want_nccl, &nccl_why);
  if (world == 1 && !nccl_only) m.chain.add(std::make_unique<LocalBackend>());
  if (config.custom_all_reduce && world > 1) m.add_custom(pinned, config);
  if (want_nccl) m.add_nccl(peers, nccl_why);
  if (m.custom != nullptr) m.load_tune_table(peers);
  m.watch_members();
  m.start_watchdog();
}

Group::~Group() = default;
Group::Group(Group&&) noexcept = default;
Group& Group::operator=(Group&&) noexcept = default;

int Group::rank() const noexcept { return impl_->boot.rank(); }
int Group::world_size() const noexcept { return impl_->boot.world_size(); }
int Group::device() const noexcept { return impl_->device; }
const Options& Group::options() const noexcept { return impl_->options; }
const std::string& Group::last_error() const noexcept { return impl_->last_error; }
const TuneTable* Group::tune_table() const noexcept { return impl_->table; }

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

Status Group::all_reduce(const TensorView& in, const TensorView& out, Stream stream,
                         ReduceOp op) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_pair(in, out, 1, 1, "all_reduce"));
  Request req{Op::kAllReduce, in, out, op, -1, false};
  req.tag = m.tag(Op::kAllReduce, in.dtype, in.numel(), static_cast<std::uint32_t>(op));
  return m.dispatch(req, stream);
}

Status Group::all_gather(const TensorView& in, const TensorView& out, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_pair(in, out, 1, world_size(), "all_gather"));
  if (in.numel() == 0) return Status::kOk;  // the same on every rank
  Request req{Op::kAllGather, in, out, ReduceOp::kSum, -1, false};
  req.tag = m.tag(Op::kAllGather, in.dtype, in.numel());
  ExchangePlan plan;
  if (m.custom != nullptr) {
    plan = plan_all_gather(in.nbytes(), world_size(), rank());
    req.plan = &plan;
  }
  return m.dispatch(req, stream);
}

Status Group::reduce_scatter(const TensorView& in, const TensorView& out, Stream stream,
                             ReduceOp op) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_pair(in, out, world_size(), 1, "reduce_scatter"));
  Request req{Op::kReduceScatter, in, out, op, -1, false};
  req.tag = m.tag(Op::kReduceScatter, in.dtype, in.numel(), static_cast<std::uint32_t>(op));
  return m.dispatch(req, stream);
}

Status Group::all_to_all(const TensorView& in, const TensorView& out, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_pair(in, out, 1, 1, "all_to_all"));
  if (in.numel() % world_size() != 0)
    return m.fail(Status::kInvalidArgument,
                  detail::concat("all_to_all: ", in.numel(), " elements do not split evenly over ",
                                 world_size(), " ranks"));
  if (overlaps(in, out))
    return m.fail(Status::kInvalidArgument, "all_to_all: input and output overlap");
  if (in.numel() == 0) return Status::kOk;  // the same on every rank
  Request req{Op::kAllToAll, in, out, ReduceOp::kSum, -1, false};
  req.tag = m.tag(Op::kAllToAll, in.dtype, in.numel());
  ExchangePlan plan;
  if (m.custom != nullptr) {
    plan = plan_all_to_all(in.nbytes(), world_size(), rank());
    req.plan = &plan;
  }
  return m.dispatch(req, stream);
}

Status Group::all_to_all(const TensorView& in, const TensorView& out,
                         std::span<const std::int64_t> counts, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_view(in, "input", "all_to_all"));
  TPCOMM_TRY(m.check_view(out, "output", "all_to_all"));
  const int world = world_size();
  if (counts.size() != static_cast<std::size_t>(world) * static_cast<std::size_t>(world))
    return m.fail(Status::kInvalidArgument,
                  detail::concat("all_to_all: ", counts.size(), " counts, expected ", world, " x ",
                                 world, " (elements from each rank to each rank)"));
  std::int64_t sent = 0;
  std::int64_t received = 0;
  std::int64_t moved = 0;  // by every rank: zero means nothing to do anywhere
  for (int s = 0; s < world; ++s) {
    for (int d = 0; d < world; ++d) {
      const std::int64_t c = counts[static_cast<std::size_t>(s) * world + d];
      if (c < 0)
        return m.fail(Status::kInvalidArgument,
                      detail::concat("all_to_all: count from rank ", s, " to rank ", d, " is ", c));
      moved += c;
    }
    sent += counts[static_cast<std::size_t>(rank()) * world + s];
    received += counts[static_cast<std::size_t>(s) * world + rank()];
  }
  if (in.dtype != out.dtype)
    return m.fail(Status::kInvalidArgument,
                  detail::concat("all_to_all: input is ", to_string(in.dtype), ", output is ",
                                 to_string(out.dtype)));
  if (in.numel() != sent || out.numel() != received)
    return m.fail(Status::kInvalidArgument,
                  detail::concat("all_to_all: rank ", rank(), " sends ", sent, " and receives ",
                                 received, " elements, but the input has ", in.numel(),
                                 " and the output ", out.numel()));
  if (overlaps(in, out))
    return m.fail(Status::kInvalidArgument, "all_to_all: input and output overlap");
  if (moved == 0) return Status::kOk;
  Request req{Op::kAllToAll, in, out, ReduceOp::kSum, -1, false};
  req.counts = counts.data();
  req.tag = m.tag(Op::kAllToAll, in.dtype, moved, shape_hash(counts));
  ExchangePlan plan;
  if (m.custom != nullptr) {
    plan = plan_all_to_all(counts, dtype_size(in.dtype), world, rank());
    req.plan = &plan;
  }
  return m.dispatch(req, stream);
}

namespace {

/// Checks `lm_head_exchange`'s arguments; kInvalidArgument with `*message` saying what is wrong.
Status check_lm_head(const TensorView& shards, const TensorView& out, const LmHeadLayout& layout,
                     int world, int rank, std::string* message) {
  auto bad = [&](auto&&... parts) {
    *message = detail::concat("lm_head_exchange: ", parts...);
    return Status::kInvalidArgument;
  };
  if (shards.ndim != 2)
    return bad("shard_logits must be 2-d [tokens, shard columns], not ", shards.ndim, "-d");
  if (out.ndim != 2) return bad("out must be 2-d [rows, vocab], not ", out.ndim, "-d");
  if (shards.dtype != out.dtype)
    return bad("shard_logits are ", to_string(shards.dtype), ", out is ", to_string(out.dtype));
  if (layout.equal_rows < 0 && layout.per_rank.size() != static_cast<std::size_t>(world))
    return bad("the layout has ", layout.per_rank.size(), " per-rank counts for ", world, " ranks");
  std::int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    if (layout.rows_of(r) < 0) return bad("rank ", r, " has ", layout.rows_of(r), " rows");
    total += layout.rows_of(r);
  }
  if (shards.shape[0] != total)
    return bad("shard_logits have ", shards.shape[0], " rows, the layout's ranks ", total);
  if (out.shape[0] != layout.rows_of(rank))
    return bad("out has ", out.shape[0], " rows, rank ", rank, " holds ", layout.rows_of(rank));
  const std::int64_t cols = shards.shape[1];
  if (cols < 1) return bad("shard_logits have no columns");
  if (out.shape[1] < 1 || out.shape[1] > world * cols)
    return bad("out has ", out.shape[1], " columns; the vocabulary of ", world, " shards of ", cols,
               " holds 1 to ", world * cols);
  if (overlaps(shards, out)) return bad("shard_logits and out overlap");
  return Status::kOk;
}

}  // namespace

Status Group::lm_head_exchange(const TensorView& shard_logits, const TensorView& out,
                               const LmHeadLayout& layout, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_view(shard_logits, "shard_logits", "lm_head_exchange"));
  TPCOMM_TRY(m.check_view(out, "out", "lm_head_exchange"));
  std::string message;
  if (Status s = check_lm_head(shard_logits, out, layout, world_size(), rank(), &message);
      s != Status::kOk)
    return m.fail(s, std::move(message));
  if (shard_logits.numel() == 0) return Status::kOk;  // no rank has rows: the same everywhere
  Request req{Op::kLmHeadExchange, shard_logits, out, ReduceOp::kSum, -1, false};
  std::vector<std::int64_t> shape{shard_logits.shape[1], out.shape[1]};
  for (int r = 0; r < world_size(); ++r) shape.push_back(layout.rows_of(r));
  req.tag = m.tag(Op::kLmHeadExchange, shard_logits.dtype, shard_logits.numel(), shape_hash(shape));
  ExchangePlan plan;
  const char* why = m.lm_head_fallback(req, plan, layout, shard_logits.shape[1], out.shape[1]);
  if (why == nullptr) return m.dispatch(req, stream);
  m.note_fallback("lm_head_exchange: all-gather of the shards, then a copy of the local rows", why);
  return m.lm_head_by_all_gather(shard_logits, out, layout, req.tag, stream);
}

std::string Group::backend_for_all_gather(const TensorView& in,
                                          const TensorView& out) const noexcept {
  const Impl& m = *impl_;
  Request req{Op::kAllGather, in, out, ReduceOp::kSum, -1, false};
  ExchangePlan plan;
  if (m.custom != nullptr) {
    plan = plan_all_gather(in.nbytes(), world_size(), rank());
    req.plan = &plan;
  }
  return m.exchange_backend(req);
}

std::string Group::backend_for_all_to_all(const TensorView& in,
                                          const TensorView& out) const noexcept {
  const Impl& m = *impl_;
  Request req{Op::kAllToAll, in, out, ReduceOp::kSum, -1, false};
  ExchangePlan plan;
  if (m.custom != nullptr) {
    plan = plan_all_to_all(in.nbytes(), world_size(), rank());
    req.plan = &plan;
  }
  return m.exchange_backend(req);
}

std::string Group::backend_for_lm_head_exchange(const TensorView& shard_logits,
                                                const TensorView& out,
                                                const LmHeadLayout& layout) const noexcept {
  const Impl& m = *impl_;
  std::string message;
  if (check_lm_head(shard_logits, out, layout, world_size(), rank(), &message) != Status::kOk)
    return "none";
  Request req{Op::kLmHeadExchange, shard_logits, out, ReduceOp::kSum, -1, false};
  ExchangePlan plan;
  if (m.lm_head_fallback(req, plan, layout, shard_logits.shape[1], out.shape[1]) == nullptr)
    return "custom_ar:" + std::string(to_string(m.custom->choose_exchange(req).algo));
  const TensorView flat = shard_logits.flattened();
  TensorView all = flat;
  all.shape[0] *= world_size();
  const std::string gather = backend_for_all_gather(flat, all);
  return gather == "none" ? gather : "all_gather:" + gather + "+copy";
}

void Group::prepare_exchange(std::int64_t bytes_per_peer, Stream stream) {
  Impl& m = *impl_;
  TPCOMM_CHECK(bytes_per_peer >= 0, Status::kInvalidArgument, "prepare_exchange: ", bytes_per_peer,
               " bytes per peer");
  const std::int64_t bytes = bytes_per_peer * world_size();
  DeviceGuard guard(m.device);
  if (m.custom != nullptr) m.custom->impl().prepare_exchange(bytes);
  if (m.nccl == nullptr || bytes == 0) return;
  // One all-to-all of that size, so that NCCL sets up its peer-to-peer buffers now.
  struct Buffers {
    void* in = nullptr;
    void* out = nullptr;
    ~Buffers() {
      cudaFree(in);
      cudaFree(out);
    }
  } b;
  TPCOMM_CUDA_CHECK(cudaMalloc(&b.in, static_cast<std::size_t>(bytes)));
  TPCOMM_CUDA_CHECK(cudaMalloc(&b.out, static_cast<std::size_t>(bytes)));
  NcclComm& comm = m.nccl->comm();
  const auto enabled = comm.scope(true);
  Status s =
      comm.all_to_all(b.in, b.out, static_cast<std::size_t>(bytes_per_peer), DType::kU8, stream);
  if (s == Status::kOk) s = comm.wait(stream);
  TPCOMM_CHECK(s == Status::kOk, s,
               "prepare_exchange: NCCL's warm-up all-to-all failed: ", comm.last_error());
}

Status Group::broadcast(const TensorView& in, const TensorView& out, int root,
                        Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  if (root < 0 || root >= world_size())
    return m.fail(Status::kInvalidArgument,
                  detail::concat("broadcast: root ", root, " is not a rank of ", world_size()));
  if (rank() == root) {
    TPCOMM_TRY(m.check_pair(in, out, 1, 1, "broadcast"));
  } else {
    TPCOMM_TRY(m.check_view(out, "output", "broadcast"));
  }
  TensorView source = rank() == root ? in : out;
  Request req{Op::kBroadcast, source, out, ReduceOp::kSum, root, false};
  req.tag = m.tag(Op::kBroadcast, out.dtype, out.numel(), static_cast<std::uint32_t>(root));
  return m.dispatch(req, stream);
}

Status Group::send(const TensorView& buf, int peer, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_view(buf, "buffer", "send"));
  if (peer < 0 || peer >= world_size() || peer == rank())
    return m.fail(Status::kInvalidArgument,
                  detail::concat("send: peer ", peer, " is not another rank of ", world_size()));
  return m.dispatch(Request{Op::kSend, buf, buf, ReduceOp::kSum, peer, false}, stream);
}

Status Group::recv(const TensorView& buf, int peer, Stream stream) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  TPCOMM_TRY(m.check_view(buf, "buffer", "recv"));
  if (peer < 0 || peer >= world_size() || peer == rank())
    return m.fail(Status::kInvalidArgument,
                  detail::concat("recv: peer ", peer, " is not another rank of ", world_size()));
  return m.dispatch(Request{Op::kRecv, buf, buf, ReduceOp::kSum, peer, false}, stream);
}

Status Group::all_reduce_add_rmsnorm(const TensorView& x, const TensorView& residual,
                                     const TensorView& gamma, float eps, const TensorView& norm_out,
                                     const TensorView& residual_out, Stream stream,
                                     const Fp8Scales& fp8, NormWeight weight) noexcept {
  Impl& m = *impl_;
  TPCOMM_TRY(m.poll_health());
  AddRmsNormCall call;
  std::string message;
  if (Status s = check_add_rmsnorm(x, residual, gamma, eps, norm_out, residual_out, fp8, weight,
                                   "all_reduce_add_rmsnorm", &call, &message);
      s != Status::kOk)
    return m.fail(s, std::move(message));
  for (const TensorView* v : {&x, &residual, &gamma, &norm_out, &residual_out})
    if (v->data != nullptr || v != &residual)
      TPCOMM_TRY(m.check_view(*v, "a tensor", "all_reduce_add_rmsnorm"));
  if (call.rows == 0) return Status::kOk;
  Request req{Op::kAllReduceAddRmsNorm, x, residual_out, ReduceOp::kSum, -1, false};
  req.fusion = &call.fusion;
  req.tag = m.tag(
      Op::kAllReduceAddRmsNorm, x.dtype, x.numel(),
      fused_shape(static_cast<int>(call.fusion.kind), norm_form(call.fusion), call.fusion.hidden));
  const char* why = m.custom == nullptr
                        ? (world_size() == 1 ? "world size 1" : "no custom all-reduce")
                        : m.custom->supports(req).reason;
  if (why == nullptr) return m.dispatch(req, stream);
  m.note_fallback("all_reduce_add_rmsnorm: all-reduce, then add + RMSNorm", why);
  return m.add_rmsnorm_fallback(call, req.tag, stream);
}

std::string Group::backend_for_add_rmsnorm(const TensorView& x, const TensorView& norm_out,
                                           bool capturing) const noexcept {
  const Impl& m = *impl_;
  if (x.ndim < 1 || x.shape[x.ndim - 1] < 1) return "none";
  kernels::FusionParams f{};
  f.kind = norm_out.dtype == DType::kF8E4M3 ? kernels::Fusion::kAddRmsNormFp8
                                            : kernels::Fusion::kAddRmsNorm;
  f.hidden = x.shape[x.ndim - 1];
  Request req{Op::kAllReduceAddRmsNorm, x, x, ReduceOp::kSum, -1, capturing};
  req.fusion = &f;
  if (m.custom != nullptr && m.custom->supports(req).ok())
    return "custom_ar:" + std::string(to_string(m.custom->choose(req).algo));
  const std::string reduce = backend_for_all_reduce(x, x, capturing);
  return reduce == "none" ? reduce : reduce + "+add_rmsnorm";
}

std::string Group::backend_for_all_reduce(const TensorView& in, const TensorView& out,
                                          bool capturing) const noexcept {
  const Impl& m = *impl_;
  Request req{Op::kAllReduce, in, out, ReduceOp::kSum, -1, capturing};
  const Backend* b = m.chain.select(req);
  if (b == nullptr) return "none";
  if (b == m.custom) return "custom_ar:" + std::string(to_string(m.custom->choose(req).algo));
  return std::string(b->name());
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
  if (m.nccl != nullptr) {
    m.nccl_was_enabled = m.nccl->comm().enabled();
    m.nccl->comm().set_enabled(true);
  }
  if (m.custom != nullptr) m.custom->impl().begin_capture();
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
  if (m.nccl != nullptr) m.nccl->comm().set_enabled(m.nccl_was_enabled);
  if (Status s = m.compare_captured(); s != Status::kOk) {
    TPCOMM_LOG_ERROR("group rank ", m.boot.rank(), ": ", m.last_error);
    return s;
  }
  if (m.custom == nullptr) return Status::kOk;
  if (Status s = m.custom->impl().end_capture(); s != Status::kOk)
    return m.fail(s, m.custom->impl().error_message());
  return Status::kOk;
}

void Group::tune() {
  Impl& m = *impl_;
  if (m.custom == nullptr) return;
  TuneTable table = m.custom->impl().tune(m.tune_key);
  if (m.boot.rank() == 0) {
    const std::string path = tune_path(m.options, m.tune_key);
    table.save(path);
    TPCOMM_LOG_INFO("stored tuned table in ", path);
  }
  m.table_storage = std::move(table);
  m.table = &*m.table_storage;
}

}  // namespace tpcomm
