// SPDX-License-Identifier: Apache-2.0
// NcclComm's lifecycle (the id exchange, initialisation, warm-up, destruction), its waits, and
// what other threads may call: abort, the watchdog's poll, health.
#include "backends/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "backends/nccl_comm_impl.hpp"
#include "core/cuda_check.hpp"
#include "tpcomm/bootstrap.hpp"

namespace tpcomm {

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
      why = nccl_cuda_error("cudaGetDeviceCount", e);
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
    if (!settle(r, NcclClock::now() + timeout)) {
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
    TPCOMM_THROW(Status::kCudaError, nccl_cuda_error("cudaStreamCreateWithFlags", e));
  }
  void* buffer = nullptr;
  Status s = Status::kOk;
  std::string message;
  if (cudaError_t e = cudaMalloc(&buffer, sizeof(float)); e != cudaSuccess) {
    s = Status::kCudaError;
    message = nccl_cuda_error("cudaMalloc", e);
  } else if (e = cudaMemsetAsync(buffer, 0, sizeof(float), stream); e != cudaSuccess) {
    s = Status::kCudaError;
    message = nccl_cuda_error("cudaMemsetAsync", e);
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

Status NcclComm::wait(Stream stream, Milliseconds timeout) noexcept {
  if (!impl_) return Status::kInvalidArgument;
  std::lock_guard lock(impl_->mu);
  if (impl_->health.load() != Status::kOk || impl_->comm == nullptr) return Status::kAborted;
  return impl_->wait(stream, timeout);
}

Status NcclComm::wait(Stream stream) noexcept {
  return wait(stream, impl_ ? impl_->timeout : Milliseconds{0});
}

void NcclComm::abort() noexcept {
  if (!impl_) return;
  Impl& s = *impl_;
  s.abort_pending.store(true, std::memory_order_release);
  std::lock_guard lock(s.mu);  // an owner settling a call lets go at its next poll
  Status expected = Status::kOk;
  s.health.compare_exchange_strong(expected, Status::kAborted);
  s.abort_comm();
}

Status NcclComm::poll(std::string* message) noexcept {
  if (!impl_) return Status::kInvalidArgument;
  Impl& s = *impl_;
  std::unique_lock lock(s.mu, std::try_to_lock);
  // The owner is inside a call, which polls NCCL's error itself and is bounded by the timeout.
  if (!lock.owns_lock()) return s.health.load();
  auto report = [&](Status st) {
    if (message != nullptr) {
      try {
        *message = s.last_error;
      } catch (...) {  // NOLINT(bugprone-empty-catch): the status stands without its message
      }
    }
    return st;
  };
  if (Status h = s.health.load(); h != Status::kOk) return report(h);
  if (s.comm == nullptr) return Status::kOk;
  ncclResult_t state = ncclSuccess;
  if (ncclResult_t q = s.lib->ncclCommGetAsyncError(s.comm, &state); q != ncclSuccess) state = q;
  if (state != ncclSuccess && state != ncclInProgress)
    return report(s.fail(Status::kNcclError,
                         "asynchronous NCCL error: " + s.lib->error_string(state, s.comm)));
  if (!s.pending) return Status::kOk;
  const cudaError_t e = cudaEventQuery(s.done);
  if (e == cudaSuccess) {
    s.pending = false;
    return Status::kOk;
  }
  if (e != cudaErrorNotReady)
    return report(
        s.fail(Status::kCudaError, nccl_cuda_error("cudaEventQuery (NCCL's eager work)", e)));
  if (NcclClock::now() - s.pending_since < s.timeout) return Status::kOk;
  return report(s.fail(Status::kTimeout,
                       detail::concat("an NCCL operation enqueued ", s.timeout.count(),
                                      " ms ago has not finished (a peer missing or stuck?)")));
}

bool NcclComm::aborted_unfinished() const noexcept {
  return impl_ && impl_->unfinished.load(std::memory_order_acquire);
}

Status NcclComm::health() const noexcept {
  return impl_ ? impl_->health.load() : Status::kInvalidArgument;
}

std::string NcclComm::last_error() const {
  if (!impl_) return {};
  std::lock_guard lock(impl_->mu);
  return impl_->last_error;
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
