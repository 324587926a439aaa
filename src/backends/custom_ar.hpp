// SPDX-License-Identifier: Apache-2.0
// The custom all-reduce: one-shot, two-shot and Lamport kernels over peer memory (docs/DESIGN.md
// §4-6).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/fingerprint.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tune/algorithms.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"

namespace tpcomm {

/// One rank's share of a custom all-reduce group: its workspace (a `PeerBuffer` laid out as
/// `WorkspaceLayout`), host-mapped error and abort words, and the registry of buffers used
/// inside CUDA graphs.
///
/// Not thread-safe; one in-flight operation at a time (calls are stream-ordered on one stream).
class CustomAllReduce {
 public:
  /// Collective. Allocates and maps the workspaces, probes every mapping with a real write and
  /// read, and agrees across ranks: returns nullptr on every rank (with `why_not`) when any rank
  /// cannot take part, so that all ranks then use NCCL alike.
  static std::unique_ptr<CustomAllReduce> create(Bootstrap& boot, int device,
                                                 const Options& options, std::string* why_not);
  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  /// What the selector may use: world size, size limit, blocks per kernel.
  [[nodiscard]] const SelectorCaps& caps() const noexcept { return caps_; }

  /// Reduces (sums) `in` into `out` (same dtype and element count, contiguous, any alignment;
  /// `in == out` allowed) with `choice`. `capturing`: the stream is being captured inside an open
  /// capture scope; large messages then read the caller's buffer in place and record it for
  /// registration. The caller asks `health()` before each call (a failed group's kernels would
  /// only give up at their start); kUnsupported when the registry is full. With `fusion`, the
  /// Lamport kernel of `choice` also runs that epilogue (`out` is then residual_out). `tag` is what
  /// the kernels check against their peers' (NOTE [fingerprints] in kernels/common/sync.cuh).
  /// `scattered`: the reduce-scatter form of a fused call, whose outputs hold this rank's rows
  /// alone (`kernels::AllReduceParams::scattered`).
  [[nodiscard]] Status run(const TensorView& in, const TensorView& out, Choice choice,
                           bool capturing, Stream stream, const CallTag& tag,
                           const kernels::FusionParams* fusion = nullptr,
                           bool scattered = false) noexcept;

  /// Runs this rank's part of an exchange (all-gather, all-to-all, the LM-head exchange):
  /// copies `plan.from[s]` of rank s's input into `out` for every rank s (NOTE [exchange] in
  /// kernels/exchange.cu). `in` is this rank's whole input (`plan.input_bytes`), any alignment;
  /// it must not overlap `out`. `capturing` as for `run`: inside an open capture scope an
  /// aligned input is read in place and recorded for registration. Every rank must call it with
  /// the same `choice`. `health()` as for `run`; kUnsupported when the registry is full. `tag` as
  /// for `run`.
  [[nodiscard]] Status exchange(const ExchangePlan& plan, const TensorView& in,
                                const TensorView& out, ExchangeChoice choice, bool capturing,
                                Stream stream, const CallTag& tag) noexcept;

  /// Collective: one barrier of the exchange's kernel that moves nothing, its flags carrying
  /// `tag` (NOTE [fingerprints]): ranks whose calls differ, or are out of step, fail with
  /// kMismatch naming both, and the kernels after it give up. What checks an eager call that
  /// NCCL serves before it reaches NCCL (`Options::nccl_check`).
  [[nodiscard]] Status check_call(const CallTag& tag, Stream stream) noexcept;

  /// Collective: makes the exchange's staging buffer hold inputs of at least `bytes` bytes (an
  /// extra peer buffer, two halves of `bytes`; nothing when the all-reduce's staging already
  /// holds them or an earlier call made one as large), so that nothing is allocated later. All
  /// ranks vote: throws `Error` on every rank when any rank cannot allocate or map it. Not
  /// graph-safe.
  void prepare_exchange(std::int64_t bytes);

  /// Collective, once per stream (later calls return at once): launches every kernel of the
  /// group once on `stream` with nothing to do, waits for the stream (and so for the caller's
  /// kernels launched on it before), and meets every rank at a barrier, so that no kernel is
  /// launched on `stream` for the first time while a peer waits for this rank (NOTE [first
  /// launch] in custom_ar.cpp). Does nothing on a stream that is being captured. kTimeout (sticky)
  /// when a peer does not arrive at the barrier.
  [[nodiscard]] Status warm_up(Stream stream) noexcept;

  /// Measures every candidate (algorithm x launch shape) of the registry per size bucket, each
  /// as a CUDA graph of back-to-back bf16 all-reduces replayed on a private stream
  /// (`GraphTimer`), and every algorithm that fuses for the fused all-reduce + add + RMSNorm
  /// (`tune_fused`), and returns the table rank 0's times decide. Collective; throws `Error`
  /// when a measurement fails (a timed-out peer, a CUDA error).
  TuneTable tune(const TuneKey& key);

  /// A capture scope opened: subsequent captured calls may register buffers.
  void begin_capture() noexcept;
  /// Collective: exchanges the buffers recorded since `begin_capture` and fills their slots.
  /// Every rank must have recorded the same number; any rank's failure fails all.
  [[nodiscard]] Status end_capture() noexcept;

  /// kOk, or kTimeout/kAborted/kMismatch once a kernel gave up (sticky), with
  /// `error_message()` naming who waited for whom, or both ranks' calls. Logged once.
  [[nodiscard]] Status health() noexcept;
  /// What `health` reads, safe from any thread (the group's watchdog): kOk while no kernel gave
  /// up; else the failure and, in `message`, what happened (worked out once, on the first call
  /// after the kernels reported, by reading the pads on a side stream). Does not log.
  [[nodiscard]] Status kernel_failure(std::string* message) noexcept;
  [[nodiscard]] const std::string& error_message() const noexcept { return error_message_; }
  /// Makes every waiting and future kernel of this group give up. Idempotent.
  void abort() noexcept;
  /// The kernels' part of `abort()` alone: safe from any thread, while the owner uses this.
  void abort_kernels() noexcept;

 private:
  struct Impl;
  CustomAllReduce(std::unique_ptr<Impl> impl, SelectorCaps caps);

  /// True where a kernel of `blocks` blocks (in clusters of `group`) may let the next launch in
  /// early: every rank sharing the GPU has room for two of them at once (NOTE [programmatic
  /// launch] in kernels/common/sync.cuh).
  [[nodiscard]] bool early_launch(int blocks, int group) const noexcept;

  std::unique_ptr<Impl> impl_;
  SelectorCaps caps_;
  bool capture_open_ = false;
  std::int64_t next_slot_ = 0;
  Status health_ = Status::kOk;
  std::string error_message_;
};

}  // namespace tpcomm
