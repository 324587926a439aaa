// SPDX-License-Identifier: Apache-2.0
#include "backends/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backends/nccl_lib.hpp"
#include "core/check.hpp"
#include "core/cuda_check.hpp"
#include "core/log.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES);

/// Paces a polling loop: yields for the first polls, then sleeps briefly, so that a wait of
/// microseconds costs microseconds and a wait of seconds does not burn a core.
class Backoff {
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

std::string cuda_error(const char* call, cudaError_t e) {
  return detail::concat(call, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

}  // namespace

struct NcclComm::Impl {
  const NcclLib* lib = nullptr;
  ncclComm_t comm = nullptr;
  int rank = 0;
  int world_size = 1;
  int device = -1;
  Milliseconds timeout{30000};
  bool enabled = true;
  Status health = Status::kOk;
  std::string last_error;

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
    if (ncclResult_t r = lib->ncclCommAbort(comm); r != ncclSuccess) {
      TPCOMM_LOG_WARN("nccl rank ", rank, ": ncclCommAbort: ", lib->error_string(r));
    }
    comm = nullptr;
  }

  /// Polls NCCL until the non-blocking call that returned `r` has finished, leaving its final
  /// result in `r`; false when `deadline` passes first.
  bool settle(ncclResult_t& r, Clock::time_point deadline) const noexcept {
    Backoff backoff;
    while (r == ncclInProgress) {
      if (Clock::now() >= deadline) return false;
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
    if (!settle(r, Clock::now() + timeout)) {
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
        Clock::now() + std::clamp(limit, Milliseconds{0}, Milliseconds{Options::kMaxTimeoutMs});
    Backoff backoff;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return Status::kOk;
      if (e != cudaErrorNotReady) return fail(Status::kCudaError, cuda_error("cudaStreamQuery", e));
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t q = lib->ncclCommGetAsyncError(comm, &state); q != ncclSuccess) state = q;
      if (state != ncclSuccess && state != ncclInProgress) {
        return fail(Status::kNcclError,
                    "asynchronous NCCL error: " + lib->error_string(state, comm));
      }
      if (Clock::now() >= deadline) {
        return fail(Status::kTimeout,
                    detail::concat("wait: the stream did not finish within ", limit.count(),
                                   " ms (a peer missing or stuck?)"));
      }
      backoff.pause();
    }
  }

  /// Destroys a healthy communicator, aborts any other. Bounded by `timeout`.
  void release() noexcept {
    if (comm == nullptr) return;
    if (health != Status::kOk) {
      abort_comm();
      return;
    }
    if (lib->has_comm_finalize) {
      ncclResult_t r = lib->ncclCommFinalize(comm);
      if (!settle(r, Clock::now() + timeout) || r != ncclSuccess) {
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

ncclUniqueId NcclComm::Impl::share_id(Bootstrap& bootstrap, const Options& options) {
  // Local checks come before the id exchange, and rank 0 sends an empty id when it cannot
  // make one: every rank still takes part in the broadcast (keeping the bootstrap's sequence
  // aligned), and a failure on rank 0 fails every rank at once instead of at the timeout.
  Status local = Status::kOk;
  std::string why;
  lib = NcclLib::try_load(options.nccl_path, &why);
  if (lib == nullptr) local = Status::kUnavailable;
  if (local == Status::kOk) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      local = Status::kUnavailable;
      why = cuda_error("cudaGetDeviceCount", e);
    } else if (device < 0 || device >= count) {
      local = Status::kInvalidArgument;
      why = detail::concat("device ", device, " does not exist (", count, " visible)");
    }
  }
  ncclUniqueId id{};
  std::span<const std::byte> payload;
  if (rank == 0 && local == Status::kOk) {
    if (ncclResult_t r = lib->ncclGetUniqueId(&id); r != ncclSuccess) {
      local = Status::kUnavailable;
      why = "ncclGetUniqueId: " + lib->error_string(r);
    } else {
      payload = std::as_bytes(std::span(&id, 1));
    }
  }
  const Bytes received = bootstrap.broadcast(payload, 0);
  TPCOMM_CHECK(local == Status::kOk, local, "NCCL communicator, rank ", rank, ": ", why);
  TPCOMM_CHECK(received.size() == sizeof(id), Status::kUnavailable, "NCCL communicator, rank ",
               rank, ": rank 0 could not create an NCCL id (its error says why)");
  std::memcpy(&id, received.data(), sizeof(id));
  return id;
}

void NcclComm::Impl::init(const ncclUniqueId& id, const Options& options, const std::string& who) {
  {
    DeviceGuard guard(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking, so that no call can hang this thread inside NCCL and abort always works.
    config.blocking = 0;
    ncclResult_t r = lib->ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
    if (!settle(r, Clock::now() + timeout)) {
      give_up(Status::kTimeout,
              detail::concat("ncclCommInitRankConfig (", who, ") did not finish within ",
                             options.timeout_ms, " ms: a peer is missing or stuck"));
    }
    if (r != ncclSuccess) {
      give_up(Status::kNcclError,
              detail::concat("ncclCommInitRankConfig (", who, "): ", lib->error_string(r, comm)));
    }
  }
  int nccl_ranks = 0;
  int nccl_rank = -1;
  ncclResult_t r = lib->ncclCommCount(comm, &nccl_ranks);
  if (r == ncclSuccess) r = lib->ncclCommUserRank(comm, &nccl_rank);
  if (r != ncclSuccess || nccl_ranks != world_size || nccl_rank != rank) {
    give_up(Status::kInternal, detail::concat("NCCL reports rank ", nccl_rank, " of ", nccl_ranks,
                                              " for ", who, " (", lib->error_string(r, comm), ")"));
  }
}

NcclComm::NcclComm(Bootstrap& bootstrap, int device, const Options& options, bool enabled)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.rank = bootstrap.rank();
  s.world_size = bootstrap.world_size();
  s.device = device;
  s.timeout = Milliseconds(std::clamp<std::int64_t>(options.timeout_ms, 1, Options::kMaxTimeoutMs));
  s.enabled = enabled;
  const ncclUniqueId id = s.share_id(bootstrap, options);
  const std::string who =
      detail::concat("rank ", s.rank, " of ", s.world_size, ", device ", device);
  s.init(id, options, who);
  warm_up();
  TPCOMM_LOG_INFO("NCCL ", s.lib->version_string(), " communicator ready: ", who);
}

void NcclComm::warm_up() {
  // NCCL connects peers lazily, on the first collective: pay for it here rather than in the
  // first real call, which may be inside a CUDA graph capture. Runs whatever the state.
  StateScope on = scope(true);
  DeviceGuard guard(impl_->device);
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    TPCOMM_THROW(Status::kCudaError, cuda_error("cudaStreamCreateWithFlags", e));
  }
  void* buffer = nullptr;
  Status s = Status::kOk;
  std::string message;
  if (cudaError_t e = cudaMalloc(&buffer, sizeof(float)); e != cudaSuccess) {
    s = Status::kCudaError;
    message = cuda_error("cudaMalloc", e);
  } else if (e = cudaMemsetAsync(buffer, 0, sizeof(float), stream); e != cudaSuccess) {
    s = Status::kCudaError;
    message = cuda_error("cudaMemsetAsync", e);
  } else {
    s = all_reduce(buffer, buffer, 1, DType::kF32, ReduceOp::kSum, stream);
    if (s == Status::kOk) s = wait(stream);
    message = last_error();
  }
  // cudaFree synchronises the device, which after a failure might never finish: the four
  // bytes are then left behind. The stream is released once its work drains.
  if (s == Status::kOk) cudaFree(buffer);
  cudaStreamDestroy(stream);
  if (s != Status::kOk) {
    abort();
    TPCOMM_THROW(s, "NCCL warm-up all-reduce failed (rank ", impl_->rank, ", device ",
                 impl_->device, "): ", message);
  }
}

NcclComm::~NcclComm() = default;
NcclComm::NcclComm(NcclComm&& other) noexcept = default;
NcclComm& NcclComm::operator=(NcclComm&& other) noexcept = default;

Status NcclComm::ready() const noexcept {
  if (!impl_) return Status::kInvalidArgument;
  if (impl_->health != Status::kOk) return Status::kAborted;
  if (!impl_->enabled) return Status::kUnsupported;
  return Status::kOk;
}

template <class Enqueue>
Status NcclComm::call(DType dtype, Enqueue&& enqueue) noexcept {
  TPCOMM_TRY(ready());
  ncclDataType_t type{};
  TPCOMM_TRY(impl_->nccl_type(dtype, type));
  return enqueue(*impl_, type);
}

Status NcclComm::all_reduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                            Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_reduce", count, in, out));
    return s.finish(
        s.lib->ncclAllReduce(in, out, count, type, NcclLib::to_nccl(op), s.comm, stream),
        "ncclAllReduce");
  });
}

Status NcclComm::all_gather(const void* in, void* out, std::size_t count, DType dtype,
                            Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_gather", count, in, out));
    return s.finish(s.lib->ncclAllGather(in, out, count, type, s.comm, stream), "ncclAllGather");
  });
}

Status NcclComm::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                ReduceOp op, Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("reduce_scatter", count, in, out));
    return s.finish(
        s.lib->ncclReduceScatter(in, out, count, type, NcclLib::to_nccl(op), s.comm, stream),
        "ncclReduceScatter");
  });
}

Status NcclComm::broadcast(const void* in, void* out, std::size_t count, DType dtype, int root,
                           Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("broadcast", "root", root));
    if (root == s.rank) TPCOMM_TRY(s.check_buffer("broadcast", "in (root)", count, in));
    TPCOMM_TRY(s.check_buffer("broadcast", "out", count, out));
    return s.finish(s.lib->ncclBroadcast(in, out, count, type, root, s.comm, stream),
                    "ncclBroadcast");
  });
}

Status NcclComm::send(const void* in, std::size_t count, DType dtype, int peer,
                      Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("send", "peer", peer));
    TPCOMM_TRY(s.check_buffer("send", "in", count, in));
    return s.finish(s.lib->ncclSend(in, count, type, peer, s.comm, stream), "ncclSend");
  });
}

Status NcclComm::recv(void* out, std::size_t count, DType dtype, int peer, Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_rank("recv", "peer", peer));
    TPCOMM_TRY(s.check_buffer("recv", "out", count, out));
    return s.finish(s.lib->ncclRecv(out, count, type, peer, s.comm, stream), "ncclRecv");
  });
}

Status NcclComm::all_to_all(const void* in, void* out, std::size_t count, DType dtype,
                            Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    TPCOMM_TRY(s.check_in_out("all_to_all", count, in, out));
    if (!s.lib->has_all_to_all) {
      const std::vector<std::int64_t> counts(
          static_cast<std::size_t>(s.world_size) * static_cast<std::size_t>(s.world_size),
          static_cast<std::int64_t>(count));
      return s.all_to_all_grouped(in, out, counts, dtype, type, stream);
    }
    return s.finish(s.lib->ncclAlltoAll(in, out, count, type, s.comm, stream), "ncclAlltoAll");
  });
}

Status NcclComm::all_to_all(const void* in, void* out, std::span<const std::int64_t> counts,
                            DType dtype, Stream stream) noexcept {
  return call(dtype, [&](Impl& s, ncclDataType_t type) {
    if (counts.size() !=
        static_cast<std::size_t>(s.world_size) * static_cast<std::size_t>(s.world_size))
      return s.refuse(Status::kInvalidArgument,
                      "all_to_all: the counts do not have world size x world size entries");
    std::int64_t sent = 0;
    std::int64_t received = 0;
    for (int peer = 0; peer < s.world_size; ++peer) {
      sent += counts[static_cast<std::size_t>(s.rank) * s.world_size + peer];
      received += counts[static_cast<std::size_t>(peer) * s.world_size + s.rank];
    }
    TPCOMM_TRY(s.check_buffer("all_to_all", "in", static_cast<std::size_t>(sent), in));
    TPCOMM_TRY(s.check_buffer("all_to_all", "out", static_cast<std::size_t>(received), out));
    return s.all_to_all_grouped(in, out, counts, dtype, type, stream);
  });
}

Status NcclComm::group_start() noexcept {
  TPCOMM_TRY(ready());
  return impl_->finish(impl_->lib->ncclGroupStart(), "ncclGroupStart");
}

Status NcclComm::group_end() noexcept {
  TPCOMM_TRY(ready());
  return impl_->finish(impl_->lib->ncclGroupEnd(), "ncclGroupEnd");
}

Status NcclComm::wait(Stream stream, Milliseconds timeout) noexcept {
  if (!impl_) return Status::kInvalidArgument;
  if (impl_->health != Status::kOk) return Status::kAborted;
  return impl_->wait(stream, timeout);
}

Status NcclComm::wait(Stream stream) noexcept {
  return wait(stream, impl_ ? impl_->timeout : Milliseconds{0});
}

void NcclComm::abort() noexcept {
  if (!impl_) return;
  if (impl_->health == Status::kOk) impl_->health = Status::kAborted;
  impl_->abort_comm();
}

Status NcclComm::health() const noexcept {
  return impl_ ? impl_->health : Status::kInvalidArgument;
}

const std::string& NcclComm::last_error() const noexcept {
  static const std::string kNone;
  return impl_ ? impl_->last_error : kNone;
}

bool NcclComm::enabled() const noexcept { return impl_ && impl_->enabled; }

void NcclComm::set_enabled(bool enabled) noexcept {
  if (impl_) impl_->enabled = enabled;
}

int NcclComm::rank() const noexcept { return impl_ ? impl_->rank : -1; }
int NcclComm::world_size() const noexcept { return impl_ ? impl_->world_size : 0; }
int NcclComm::device() const noexcept { return impl_ ? impl_->device : -1; }
int NcclComm::version() const noexcept { return impl_ ? impl_->lib->version() : 0; }
const NcclLib& NcclComm::lib() const noexcept { return *impl_->lib; }
ncclComm* NcclComm::native_handle() const noexcept { return impl_ ? impl_->comm : nullptr; }

}  // namespace tpcomm
