// SPDX-License-Identifier: Apache-2.0
// The one way tpcomm times CUDA graphs: `tpcomm bench --graph` and the tuner both use it.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/types.hpp"

namespace tpcomm {

// NOTE [graphs of virtual ranks]
// Some CUDA calls (instantiating, uploading and destroying a graph; copies to pageable memory)
// can wait for the device, or for a lock that a waiting call holds. Where ranks share a GPU,
// that wait never ends while one rank's kernel spins for a peer whose thread is blocked in such
// a call. So: no rank captures while its kernels are in flight, every rank instantiates and
// uploads before any rank launches, replays start after a barrier with nothing else in between,
// and each rank destroys its graph before the next collective.

/// One rank's CUDA graph of back-to-back operations, captured on a stream and timed by
/// replaying it. Not thread-safe; one per rank.
class GraphTimer {
 public:
  explicit GraphTimer(Stream stream);
  ~GraphTimer();
  GraphTimer(const GraphTimer&) = delete;
  GraphTimer& operator=(const GraphTimer&) = delete;

  /// Captures what `enqueue()` launches on the stream (thread-local capture mode), instantiates
  /// and uploads the graph, and waits for the upload. `enqueue` returns an empty string, or what
  /// failed. Returns an empty string, or what failed (the graph is then unusable).
  std::string capture(const std::function<std::string()>& enqueue);

  /// Collective over `boot`: meets every rank, replays the graph `warmup` times (at least once)
  /// and waits, meets again, then replays it `replays` times back to back with an event between
  /// replays. `*us` receives the median replay, in microseconds. Returns an empty string, or what
  /// failed.
  std::string time(Bootstrap& boot, int replays, double* us, int warmup = 1);

  /// Replays the graph once more on the stream, without waiting. Empty, or what failed.
  std::string replay();

  /// Destroys the graph (NOTE [graphs of virtual ranks]: before the next collective).
  void reset() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
