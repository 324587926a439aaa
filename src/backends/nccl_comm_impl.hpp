// SPDX-License-Identifier: Apache-2.0
// The state of an `NcclComm` and what its operations share: internal to nccl_comm.cpp (its
// lifecycle, waits and the watchdog's poll) and nccl_comm_ops.cpp (the collectives).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "backends/nccl_comm.hpp"
#include "backends/nccl_lib.hpp"
#include "core/check.hpp"
#include "core/log.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm {

using NcclClock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES);

/// Paces a polling loop: yields for the first polls, then sleeps briefly, so that a wait of
/// microseconds costs microseconds and a wait of seconds does not burn a core.
class NcclBackoff {
 public:
  void pause() noexcept {
    if (++polls_ < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  static constexpr int kYieldPolls = 1000;
  int polls_ = 0;
};

inline std::string nccl_cuda_error(const char* call, cudaError_t e) {
  return detail::concat(call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// NOTE [nccl from two threads]
// The thread that owns a communicator enqueues its operations; a group's watchdog (NOTE
// [watchdog] in coordinator/watchdog.hpp) and `abort()` from any thread may act on it meanwhile.
// NCCL lets a non-blocking communicator be aborted from another thread, but `ncclCommAbort` frees
// it, so every use of the handle holds `mu`: the owner's operations (enqueueing and settling), the
// watchdog's poll (`poll`, which only tries the lock: an owner inside a call is bounded by the
// timeout and polls NCCL's error itself) and the abort. An owner settling a call sees
// `abort_pending` at its next poll and lets go, so an abort waits microseconds, not the timeout.
// The eager operations' completion is tracked with one event, recorded after each (never under
// capture, nor inside an NCCL group, whose work is enqueued only at its end): the watchdog aborts
// the communicator once the oldest unfinished one is older than the timeout, which makes NCCL's
// kernels return, so the stream moves on.
struct NcclComm::Impl {
  const NcclLib* lib = nullptr;
  ncclComm_t comm = nullptr;  // guarded by mu
  int rank = 0;
  int world_size = 1;
  int device = -1;
  Milliseconds timeout{30000};
  bool enabled = true;
  std::atomic<Status> health{Status::kOk};
  std::string last_error;  // guarded by mu
  std::mutex mu;
  std::atomic<bool> abort_pending{false};
  int group_depth = 0;  // NCCL groups open on the owning thread
  // Eager work (NOTE [nccl from two threads]), guarded by mu.
  cudaEvent_t done = nullptr;
  bool pending = false;
  NcclClock::time_point pending_since{};
  std::atomic<bool> unfinished{false};  // eager work was pending when the communicator failed

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() { release(); }

  /// Keeps `message` as the last error and returns `s`; the communicator stays usable.
  Status refuse(Status s, std::string_view message) noexcept {
    try {
      last_error.assign(message);
      if (s == Status::kUnsupported) {
        TPCOMM_LOG_DEBUG("nccl rank ", rank, ": ", message);
      } else {
        TPCOMM_LOG_WARN("nccl rank ", rank, ": ", message);
      }
    } catch (...) {
    }
    return s;
  }

  /// Records a failure that leaves the communicator unusable, aborts it and returns `s`.
  Status fail(Status s, std::string_view message) noexcept {
    try {
      last_error.assign(message);
      TPCOMM_LOG_ERROR("nccl rank ", rank, ": ", message, "; communicator aborted");
    } catch (...) {
    }
    health = s;
    abort_comm();
    return s;
  }

  /// `fail` for an operation that let go because another thread is aborting the communicator
  /// (NOTE [nccl from two threads]): that abort is done here, under the lock the owner holds.
  Status let_go(const char* what) noexcept {
    try {
      last_error = detail::concat(what, ": the communicator was aborted while the call settled");
    } catch (...) {
    }
    Status expected = Status::kOk;
    health.compare_exchange_strong(expected, Status::kAborted);
    abort_comm();
    return Status::kAborted;
  }

  /// Records the completion of the eager work just enqueued on `stream` (NOTE [nccl from two
  /// threads]); nothing under capture or inside a group. Under `mu`.
  void track(Stream stream) noexcept {
    if (group_depth > 0) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone)
      return;
    if (done == nullptr && cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
      done = nullptr;
      return;
    }
    if (cudaEventRecord(done, stream) != cudaSuccess) return;
    if (!pending) {
      pending = true;
      pending_since = NcclClock::now();
    }
  }

  /// Construction failed: aborts the half-made communicator (quietly: the exception reports)
  /// and throws.
  [[noreturn]] void give_up(Status s, const std::string& message) {
    health = s;
    abort_comm();
    TPCOMM_THROW(s, message);
  }

  /// Loads NCCL, checks the device and hands every rank rank 0's unique id (collective over
  /// `bootstrap`). Throws when this rank or rank 0 cannot go on.
  ncclUniqueId share_id(Bootstrap& bootstrap, const Options& options);
  /// Creates the communicator from `id` with this device current and checks that NCCL agrees
  /// on rank and world size; `who` names this rank in errors. Throws, aborting, on failure.
  void init(const ncclUniqueId& id, const Options& options, const std::string& who);

  void abort_comm() noexcept {
    if (comm == nullptr) return;
    if (pending && done != nullptr && cudaEventQuery(done) == cudaErrorNotReady)
      unfinished.store(true, std::memory_order_release);
    if (ncclResult_t r = lib->ncclCommAbort(comm); r != ncclSuccess) {
      TPCOMM_LOG_WARN("nccl rank ", rank, ": ncclCommAbort: ", lib->error_string(r));
    }
    comm = nullptr;
  }

  /// Polls NCCL until the non-blocking call that returned `r` has finished, leaving its final
  /// result in `r`; false when `deadline` passes first.
  bool settle(ncclResult_t& r, NcclClock::time_point deadline) const noexcept {
    NcclBackoff backoff;
    while (r == ncclInProgress) {
      if (NcclClock::now() >= deadline || abort_pending.load(std::memory_order_acquire))
        return false;
      backoff.pause();
      ncclResult_t state = ncclInProgress;
      const ncclResult_t q = lib->ncclCommGetAsyncError(comm, &state);
      r = q != ncclSuccess ? q : state;
    }
    return true;
  }

  /// The status of an enqueueing call `what` that returned `r`, after NCCL has finished it.
  Status finish(ncclResult_t r, const char* what) noexcept {
    if (r == ncclSuccess) return Status::kOk;
    if (!settle(r, NcclClock::now() + timeout)) {
      if (abort_pending.load(std::memory_order_acquire)) return let_go(what);
      return fail(Status::kTimeout,
                  detail::concat(what, " still in progress after ", timeout.count(), " ms"));
    }
    if (r == ncclSuccess) return Status::kOk;
    if (r == ncclInvalidArgument) {
      return refuse(Status::kInvalidArgument,
                    detail::concat(what, ": ", lib->error_string(r, comm)));
    }
    return fail(Status::kNcclError, detail::concat(what, ": ", lib->error_string(r, comm)));
  }

  Status nccl_type(DType t, ncclDataType_t& out) noexcept {
    if (auto v = lib->to_nccl(t)) {
      out = *v;
      return Status::kOk;
    }
    return refuse(Status::kUnsupported,
                  detail::concat("NCCL ", lib->version_string(), " has no ", to_string(t),
                                 " type (fp8 needs NCCL 2.24 or newer)"));
  }

  /// Refuses a null buffer that NCCL would read or write (`count` elements).
  Status check_buffer(const char* what, const char* name, std::size_t count,
                      const void* p) noexcept {
    if (count > 0 && p == nullptr) {
      return refuse(Status::kInvalidArgument,
                    detail::concat(what, ": ", name, " is null for ", count, " elements"));
    }
    return Status::kOk;
  }

  /// `check_buffer` of `in`, then of `out`.
  Status check_in_out(const char* what, std::size_t count, const void* in,
                      const void* out) noexcept {
    TPCOMM_TRY(check_buffer(what, "in", count, in));
    return check_buffer(what, "out", count, out);
  }

  Status check_rank(const char* what, const char* role, int r) noexcept {
    if (r < 0 || r >= world_size) {
      return refuse(Status::kInvalidArgument,
                    detail::concat(what, ": ", role, " ", r, " is not a rank of ", world_size));
    }
    return Status::kOk;
  }

  /// An all-to-all as grouped `ncclSend`/`ncclRecv`: `counts[s * world_size + d]` elements
  /// from rank s to rank d, taken in order of d from `in` and stored in order of s in `out`.
  /// For an NCCL without `ncclAlltoAll`, and for per-peer counts.
  Status all_to_all_grouped(const void* in, void* out, std::span<const std::int64_t> counts,
                            DType dtype, ncclDataType_t type, Stream stream) noexcept {
    const auto elem = static_cast<std::size_t>(dtype_size(dtype));
    const auto* src = static_cast<const std::byte*>(in);
    auto* dst = static_cast<std::byte*>(out);
    auto count = [&](int from, int to) {
      return static_cast<std::size_t>(counts[static_cast<std::size_t>(from) * world_size + to]);
    };
    if (ncclResult_t r = lib->ncclGroupStart(); r != ncclSuccess) {
      return finish(r, "ncclGroupStart");
    }
    // Peers in the same order on every rank; the send to self pairs with the receive from self
    // inside the group. Calls inside a group only queue work, so anything but success or "in
    // progress" is an error.
    ncclResult_t first = ncclSuccess;
    const char* first_call = "";
    std::size_t sent = 0;
    std::size_t received = 0;
    for (int peer = 0; peer < world_size; ++peer) {
      const std::size_t out_count = count(rank, peer);
      const std::size_t in_count = count(peer, rank);
      ncclResult_t r = lib->ncclSend(src + sent * elem, out_count, type, peer, comm, stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        first = r;
        first_call = "ncclSend (all_to_all)";
        break;
      }
      r = lib->ncclRecv(dst + received * elem, in_count, type, peer, comm, stream);
      if (r != ncclSuccess && r != ncclInProgress) {
        first = r;
        first_call = "ncclRecv (all_to_all)";
        break;
      }
      sent += out_count;
      received += in_count;
    }
    // The group is closed even after an error, or this thread's next NCCL call would join it.
    const ncclResult_t end = lib->ncclGroupEnd();
    if (first != ncclSuccess) return finish(first, first_call);
    return finish(end, "ncclGroupEnd (all_to_all)");
  }

  Status wait(Stream stream, Milliseconds limit) noexcept {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
        capture != cudaStreamCaptureStatusNone) {
      return refuse(Status::kInvalidArgument,
                    "wait: the stream is being captured into a CUDA graph");
    }
    // The caller's limit may be anything; clamped, `now + limit` cannot overflow.
    const auto deadline =
        NcclClock::now() + std::clamp(limit, Milliseconds{0}, Milliseconds{Options::kMaxTimeoutMs});
    NcclBackoff backoff;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return Status::kOk;
      if (e != cudaErrorNotReady)
        return fail(Status::kCudaError, nccl_cuda_error("cudaStreamQuery", e));
      if (abort_pending.load(std::memory_order_acquire)) return let_go("wait");
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t q = lib->ncclCommGetAsyncError(comm, &state); q != ncclSuccess) state = q;
      if (state != ncclSuccess && state != ncclInProgress) {
        return fail(Status::kNcclError,
                    "asynchronous NCCL error: " + lib->error_string(state, comm));
      }
      if (NcclClock::now() >= deadline) {
        return fail(Status::kTimeout,
                    detail::concat("wait: the stream did not finish within ", limit.count(),
                                   " ms (a peer missing or stuck?)"));
      }
      backoff.pause();
    }
  }

  /// Destroys a healthy communicator, aborts any other. Bounded by `timeout`.
  void release() noexcept {
    if (done != nullptr) {
      cudaEventDestroy(done);
      done = nullptr;
    }
    if (comm == nullptr) return;
    if (health != Status::kOk) {
      abort_comm();
      return;
    }
    if (lib->has_comm_finalize) {
      ncclResult_t r = lib->ncclCommFinalize(comm);
      if (!settle(r, NcclClock::now() + timeout) || r != ncclSuccess) {
        TPCOMM_LOG_WARN("nccl rank ", rank, ": ncclCommFinalize did not finish cleanly (",
                        lib->error_string(r, comm), "); aborting the communicator");
        abort_comm();
        return;
      }
    }
    // After a successful finalize, destroy only frees local resources and does not block.
    if (ncclResult_t r = lib->ncclCommDestroy(comm); r != ncclSuccess) {
      TPCOMM_LOG_WARN("nccl rank ", rank, ": ncclCommDestroy: ", lib->error_string(r));
    }
    comm = nullptr;
  }
};

}  // namespace tpcomm
