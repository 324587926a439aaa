// SPDX-License-Identifier: Apache-2.0
// An NCCL communicator: tpcomm's backend of last resort, which can serve every request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "tpcomm/status.hpp"
#include "tpcomm/store.hpp"
#include "tpcomm/types.hpp"

/// NCCL's communicator type, without <nccl.h>: `ncclComm_t` is `ncclComm*`.
struct ncclComm;

namespace tpcomm {

class Bootstrap;
class NcclLib;
struct Options;

/// One rank's NCCL communicator, created non-blocking so that it can always be aborted.
///
/// Behaves as SGLang's pynccl communicator (`reference/sglang-spec.md` §4) with two
/// differences: it starts enabled unless asked otherwise, and a disabled communicator answers
/// `Status::kUnsupported` instead of silently doing nothing, so that a caller's backend chain
/// moves on to the next backend.
///
/// Errors. The constructor throws `Error`. Operations are `noexcept` and return a `Status`:
///  - `kOk`: enqueued on the caller's stream (not finished: see `wait`);
///  - `kUnsupported`: disabled, or a dtype the loaded NCCL lacks (fp8 before 2.24); nothing
///    was enqueued;
///  - `kInvalidArgument`: a bad argument (null buffer, rank out of range) or NCCL's
///    `ncclInvalidArgument`; nothing was enqueued and the communicator stays usable;
///  - `kNcclError`, `kTimeout`, `kCudaError`: the communicator failed. It is aborted at once,
///    `health()` keeps the status, `last_error()` NCCL's message, and every later call answers
///    `kAborted`. Peers must abort too (they will time out); rebuild the communicator.
///
/// Counts are in **elements** of the given dtype, never bytes. Every operation except `wait`
/// is collective in NCCL's sense: all ranks call it in the same order with matching
/// arguments. Operations enqueue on the caller's stream and may be captured into a CUDA graph
/// (NCCL supports stream capture); `wait` must not be called on a capturing stream.
///
/// One thread drives a communicator; `abort()`, `poll()`, `health()` and `last_error()` are
/// thread-safe besides (NOTE [nccl from two threads] in nccl_comm.cpp): a watchdog can abort a
/// communicator whose owner is inside a call. Move-only (not while another thread uses it); a
/// moved-from communicator answers `kInvalidArgument` and may only be destroyed or assigned to.
///
/// `NCCL_COMM_BLOCKING=1` in the environment makes NCCL create a blocking communicator
/// whatever tpcomm asks; everything still works, but a dead peer can then hang a call.
class NcclComm {
 public:
  /// Creates rank `bootstrap.rank()` of a `bootstrap.world_size()`-rank communicator on CUDA
  /// device `device`. Collective over the bootstrap. Loads NCCL from `options.nccl_path`; rank
  /// 0 creates the unique id and broadcasts its 128 bytes; every rank initialises with the
  /// device current (restored afterwards) and polls for completion for at most
  /// `options.timeout_ms`, then runs one warm-up all-reduce of one float on a private stream
  /// and waits for it. `enabled` is the initial state (see `set_enabled`).
  ///
  /// Throws `Error` with NCCL's message: `kUnavailable` (no or too old NCCL, no CUDA device,
  /// rank 0 could not create an id), `kInvalidArgument` (device ordinal out of range),
  /// `kNcclError` (NCCL refused, e.g. two ranks on one GPU), `kTimeout` (a peer did not
  /// arrive within the timeout), `kCudaError`.
  NcclComm(Bootstrap& bootstrap, int device, const Options& options, bool enabled = true);
  /// Destroys the communicator when it is healthy (`ncclCommFinalize`, polled until the
  /// timeout, then `ncclCommDestroy`); aborts it otherwise or when finalising does not finish
  /// in time. Never throws, never waits longer than the timeout.
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// Reduces `count` elements of every rank's `in` into every rank's `out`. In place when
  /// `in == out`.
  [[nodiscard]] Status all_reduce(const void* in, void* out, std::size_t count, DType dtype,
                                  ReduceOp op, Stream stream) noexcept;
  /// Concatenates every rank's `count` elements of `in` into `out` (`world_size() * count`
  /// elements), in rank order.
  [[nodiscard]] Status all_gather(const void* in, void* out, std::size_t count, DType dtype,
                                  Stream stream) noexcept;
  /// Reduces `in` (`world_size() * count` elements) over ranks; rank r receives block r,
  /// `count` elements, in `out`.
  [[nodiscard]] Status reduce_scatter(const void* in, void* out, std::size_t count, DType dtype,
                                      ReduceOp op, Stream stream) noexcept;
  /// Copies `count` elements of rank `root`'s `in` into every rank's `out`. Only the root
  /// reads `in`; other ranks may pass nullptr. In place on the root when `in == out`.
  [[nodiscard]] Status broadcast(const void* in, void* out, std::size_t count, DType dtype,
                                 int root, Stream stream) noexcept;
  /// Sends `count` elements to rank `peer`, which must call `recv` with the same count and
  /// dtype. Concurrent sends and receives must sit between `group_start` and `group_end`.
  [[nodiscard]] Status send(const void* in, std::size_t count, DType dtype, int peer,
                            Stream stream) noexcept;
  /// Receives `count` elements from rank `peer` into `out`.
  [[nodiscard]] Status recv(void* out, std::size_t count, DType dtype, int peer,
                            Stream stream) noexcept;
  /// Equal-split all-to-all: block p of `in` (`count` elements at offset `p * count`) goes to
  /// rank p, which stores it as block `rank()` of its `out`. `in` and `out` hold
  /// `world_size() * count` elements and must not overlap. `ncclAlltoAll` when the loaded
  /// NCCL has it, grouped `ncclSend`/`ncclRecv` otherwise (same result).
  [[nodiscard]] Status all_to_all(const void* in, void* out, std::size_t count, DType dtype,
                                  Stream stream) noexcept;
  /// All-to-all with per-peer counts, as grouped `ncclSend`/`ncclRecv`: `counts[s * world_size()
  /// + d]` elements go from rank s to rank d (world size x world size entries, the same on every
  /// rank), taken in order of d from `in` and stored in order of s in `out`.
  [[nodiscard]] Status all_to_all(const void* in, void* out, std::span<const std::int64_t> counts,
                                  DType dtype, Stream stream) noexcept;
  /// Opens an NCCL group (thread-wide, nestable): the operations up to `group_end` are
  /// launched together.
  [[nodiscard]] Status group_start() noexcept;
  /// Closes the group and launches it. Completion is polled on this communicator only.
  [[nodiscard]] Status group_end() noexcept;

  /// Waits for everything enqueued on `stream` so far, polling `cudaStreamQuery` and NCCL's
  /// asynchronous error: `kOk` when the stream is done; on an NCCL error (`kNcclError`), a
  /// CUDA error (`kCudaError`) or when `timeout` passes first (`kTimeout`) the communicator is
  /// aborted and the status returned. `kInvalidArgument` on a stream under capture. Works
  /// whether or not the communicator is enabled. Not collective. `timeout` is clamped to
  /// 0..`Options::kMaxTimeoutMs`.
  [[nodiscard]] Status wait(Stream stream, Milliseconds timeout) noexcept;
  /// `wait` with the communicator's timeout (`Options::timeout_ms`).
  [[nodiscard]] Status wait(Stream stream) noexcept;

  /// Aborts the communicator (`ncclCommAbort`): in-flight operations stop (NCCL's kernels
  /// return, so the streams move on) and every later call answers `kAborted`. Idempotent,
  /// thread-safe: a call the owning thread is settling lets go within microseconds. Not
  /// collective, but every peer must abort too.
  void abort() noexcept;
  /// For a watchdog, from any thread: `kOk` while usable; otherwise the failure, with its
  /// message in `*message`. Fails (and aborts) the communicator on NCCL's asynchronous error
  /// (`kNcclError`) and when eager work enqueued more than the timeout ago has not finished
  /// (`kTimeout`). Never blocks: while the owner is inside a call it answers `health()`.
  [[nodiscard]] Status poll(std::string* message) noexcept;
  /// Whether the communicator failed or was aborted while eager work it had enqueued was still
  /// running (its outputs then hold whatever NCCL had written). Thread-safe.
  [[nodiscard]] bool aborted_unfinished() const noexcept;
  /// `kOk` while usable; otherwise the status that broke it (`kNcclError`, `kTimeout`,
  /// `kCudaError`) or `kAborted` after `abort()`. Thread-safe.
  [[nodiscard]] Status health() const noexcept;
  /// The message of the latest failed or refused call (NCCL's text included); empty if none.
  /// Thread-safe.
  [[nodiscard]] std::string last_error() const;

  /// Whether operations run (true) or answer `kUnsupported` (false), as pynccl's `disabled`
  /// flag inverted. Local, not collective: ranks must switch together (a rank that skips a
  /// collective hangs its peers).
  [[nodiscard]] bool enabled() const noexcept;
  void set_enabled(bool enabled) noexcept;

  /// Sets the enabled state for a scope and restores the previous one on exit: pynccl's
  /// `change_state(enable=...)`. Must not outlive the communicator or span a move of it.
  class [[nodiscard]] StateScope {
   public:
    ~StateScope() { comm_.set_enabled(previous_); }
    StateScope(const StateScope&) = delete;
    StateScope& operator=(const StateScope&) = delete;

   private:
    friend class NcclComm;
    StateScope(NcclComm& comm, bool enable) noexcept : comm_(comm), previous_(comm.enabled()) {
      comm_.set_enabled(enable);
    }
    NcclComm& comm_;
    bool previous_;
  };
  [[nodiscard]] StateScope scope(bool enable) noexcept { return StateScope(*this, enable); }

  [[nodiscard]] int rank() const noexcept;
  [[nodiscard]] int world_size() const noexcept;
  /// The CUDA device ordinal the communicator lives on.
  [[nodiscard]] int device() const noexcept;
  /// The loaded NCCL's version code (22809 for 2.28.9).
  [[nodiscard]] int version() const noexcept;
  /// The loaded NCCL's table and capability flags.
  [[nodiscard]] const NcclLib& lib() const noexcept;
  /// NCCL's handle (`ncclComm_t`), for features built on top (window registration); nullptr
  /// after an abort. The communicator keeps ownership.
  [[nodiscard]] ncclComm* native_handle() const noexcept;

 private:
  /// `kOk` when an operation may run now: the communicator is healthy and enabled.
  [[nodiscard]] Status ready() const noexcept;
  /// The frame of the operations that take a dtype: `ready()`, then NCCL's type for `dtype`
  /// (`kUnsupported` when the loaded NCCL lacks it), then `enqueue(impl, type)`, which checks
  /// the operation's own arguments and enqueues it. The first refusal is returned. Holds the
  /// lock of NOTE [nccl from two threads] throughout, and tracks the eager work it enqueued on
  /// `stream`.
  template <class Enqueue>
  [[nodiscard]] Status call(DType dtype, Stream stream, Enqueue&& enqueue) noexcept;
  /// One all-reduce of one float on a private stream, waited for (part of construction).
  void warm_up();

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
