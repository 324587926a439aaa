// SPDX-License-Identifier: Apache-2.0
// What the custom all-reduce says when a kernel gave up (NOTE [bounded waits]): the failure read
// from the host-mapped error word and the pads, and the abort that makes every kernel give up.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "backends/custom_ar_impl.hpp"
#include "backends/fingerprint.hpp"
#include "core/check.hpp"
#include "core/log.hpp"

namespace tpcomm {

/// Reads `Progress` for error word `e` on `stream`; nullopt when unreadable.
std::optional<CustomAllReduce::Impl::Progress> CustomAllReduce::Impl::progress(
    const ErrorWord& e, cudaStream_t stream) const noexcept {
  if (e.peer >= static_cast<std::uint32_t>(world) || e.block >= kMaxBlocks) return {};
  const bool lamport = e.counter == ErrorWord::kLamportCount;
  auto pad = [&](std::uint32_t r) {
    return reinterpret_cast<const SignalPad*>(workspaces[r] + layout.signal);
  };
  const SignalPad* own = pad(static_cast<std::uint32_t>(rank));
  const SignalPad* theirs = pad(e.peer);
  Progress p;
  std::uint32_t counts[2] = {};
  struct Read {
    void* to;
    const void* from;
    std::size_t bytes;
  };
  const Read reads[] = {
      {&counts[0], lamport ? &own->lamport_seq[e.block] : &own->seq[e.block], 4},
      // A flag's barrier value is its low half (NOTE [signal pad]; little-endian).
      {&counts[1],
       lamport ? static_cast<const void*>(&theirs->lamport_started[e.block])
               : static_cast<const void*>(&own->flags[e.block][e.peer]),
       4},
      {&p.call, &own->posted_call, 4},
      {&p.fingerprint, &own->posted_fingerprint, 8},
      {&p.peer_call, &theirs->posted_call, 4},
      {&p.peer_fingerprint, &theirs->posted_fingerprint, 8},
  };
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) return {};
  bool read = true;
  for (const Read& r : reads)
    read = read &&
           cudaMemcpyAsync(r.to, r.from, r.bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess;
  read = read && cudaStreamSynchronize(stream) == cudaSuccess;
  cudaSetDevice(previous);
  if (!read) return {};
  // The kernels carry fingerprints keyed by their call numbers (NOTE [fingerprints]).
  p.fingerprint = unkeyed_fingerprint(p.fingerprint, p.call);
  p.peer_fingerprint = unkeyed_fingerprint(p.peer_fingerprint, p.peer_call);
  p.op = counts[0] + 1u;
  p.peer_op = counts[1];
  if (!lamport) {
    const std::uint32_t low = counts[1] / SignalPad::kPhases;
    p.peer_op =
        p.op + static_cast<std::uint32_t>(static_cast<std::int32_t>((low - p.op) << 2) >> 2);
  }
  return p;
}

/// The status and message of the failure error word `e` reports.
std::pair<Status, std::string> CustomAllReduce::Impl::describe(const ErrorWord& e,
                                                               cudaStream_t stream) const {
  const std::optional<Progress> p = progress(e, stream);
  const std::uint32_t call = p ? p->call : 0;
  const std::uint64_t fingerprint = p ? p->fingerprint : 0;
  const std::string mine = describe_fingerprint(fingerprint);
  // The barrier kernels see a hash of the peer's fingerprint only: the peer posted the whole,
  // and the number of the call it was in.
  auto mismatch = [&](std::uint64_t theirs, std::uint32_t their_call) {
    return std::pair{
        Status::kMismatch,
        detail::concat(theirs == fingerprint && their_call != call
                           ? "ranks are out of step (one skipped or repeated a call): rank "
                           : "ranks called different collectives: rank ",
                       e.rank, " call ", call, " ", mine, ", rank ", e.peer, " call ", their_call,
                       " ", describe_fingerprint(theirs))};
  };
  if (e.code == ErrorWord::kMismatch)
    return mismatch(p ? p->peer_fingerprint : 0, p ? p->peer_call : 0);
  // A peer that waits in the same call with another fingerprint took another kind of kernel.
  if (e.code == ErrorWord::kTimeout && p && p->peer_call == call &&
      p->peer_fingerprint != fingerprint && p->peer_fingerprint != 0)
    return mismatch(p->peer_fingerprint, p->peer_call);
  const bool peer_started = !p || static_cast<std::int32_t>(p->peer_op - p->op) >= 0;
  std::string message = detail::concat(
      "custom all-reduce: rank ", e.rank,
      e.code == ErrorWord::kAborted ? " was aborted while waiting for rank "
                                    : " timed out waiting for rank ",
      e.peer, " in call ", call, " (", mine, "; block ", e.block,
      p ? detail::concat(", operation ", p->op) : std::string(), "), which ",
      !p ? std::string("may or may not have started it (its progress is unreadable)")
      : peer_started
          ? std::string("had started it (it waits for another rank, or stopped)")
          : detail::concat("had not started it (its last was operation ", p->peer_op, ")"));
  if (p && p->peer_call != call && p->peer_fingerprint != 0)
    message += detail::concat("; rank ", e.peer, "'s kernels last started call ", p->peer_call,
                              " (", describe_fingerprint(p->peer_fingerprint), ")");
  if (!peer_started && peers_in_process)
    message +=
        ". Ranks that share a process: a kernel launched for the first time on a stream while "
        "its peers wait can hold that stream until they give up; launch each of your kernels "
        "once on every stream before its first collective (README, 'Ranks that share a "
        "process')";
  return {e.code == ErrorWord::kAborted ? Status::kAborted : Status::kTimeout, std::move(message)};
}

Status CustomAllReduce::kernel_failure(std::string* message) noexcept {
  Impl& m = *impl_;
  const volatile ErrorWord* e = m.error_host;
  if (e->code == 0) return Status::kOk;
  std::lock_guard lock(m.failure_mu);
  if (m.failure == Status::kOk) {
    const ErrorWord word{e->code, e->rank, e->peer, e->block, e->counter, e->abort, e->failed};
    try {
      std::tie(m.failure, m.failure_message) = m.describe(word, m.side_stream);
    } catch (...) {  // the message could not be built; the status stands
      m.failure = word.code == ErrorWord::kAborted ? Status::kAborted : Status::kTimeout;
    }
  }
  if (message != nullptr) *message = m.failure_message;
  return m.failure;
}

Status CustomAllReduce::health() noexcept {
  if (health_ != Status::kOk) return health_;
  std::string message;
  const Status s = kernel_failure(&message);
  if (s == Status::kOk) return s;
  health_ = s;
  error_message_ = std::move(message);
  TPCOMM_LOG_ERROR(error_message_);
  return health_;
}

void CustomAllReduce::abort_kernels() noexcept {
  std::atomic_ref<std::uint32_t>(impl_->error_host->abort).store(1, std::memory_order_release);
}

void CustomAllReduce::abort() noexcept {
  Impl& m = *impl_;
  abort_kernels();
  // Kernels that never wait (their peers' data already there) would not see the abort flag:
  // mark the rank failed on the device too, so that every later kernel, a graph's above all,
  // gives up at its start (NOTE [bounded waits]). The copy engine does it beside the kernels.
  auto* pad = reinterpret_cast<SignalPad*>(m.workspaces[m.rank] + m.layout.signal);
  std::lock_guard lock(m.failure_mu);  // the side stream's other user
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(m.device) == cudaSuccess) {
    if (cudaMemcpyAsync(&pad->failed, &m.error_host->abort, sizeof(pad->failed),
                        cudaMemcpyHostToDevice, m.side_stream) == cudaSuccess)
      cudaStreamSynchronize(m.side_stream);
    cudaSetDevice(previous);
  }
  if (health_ == Status::kOk) {
    health_ = Status::kAborted;
    error_message_ = "custom all-reduce: aborted";
  }
}

}  // namespace tpcomm
