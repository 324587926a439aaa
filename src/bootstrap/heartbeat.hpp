// SPDX-License-Identifier: Apache-2.0
// A rank watch over a store that tpcomm does not run: heartbeats (NOTE [heartbeat watch]).
#pragma once

#include <memory>

#include "tpcomm/store.hpp"

namespace tpcomm {

// NOTE [heartbeat watch]
// Over the application's own store (an engine's torch.distributed store, given as callbacks)
// no connection closes when a rank's process is gone, so the watch of NOTE [rank watch] has
// nothing to see. Instead each rank's `HeartbeatStore` adds 1 to its beat key
// ("tpcomm/heartbeat/<rank>") when it is made, before the bootstrap's collective steps, and then
// every `timeout / 20` (10 to 500 ms), and reads the others'. A peer
// whose count, once it started, has not moved for `timeout` (TPCOMM_HEARTBEAT_TIMEOUT_MS) is
// reported lost on the store's `RankWatch`, with the same effects as a closed watch connection
// (the groups' kernels give up, outputs are poisoned, the watchdog acts), unless it left
// normally: a rank whose `HeartbeatStore` is destroyed sets its bye key first. A stopped
// (SIGSTOP) rank stops beating too, so it is reported after `timeout` as well. A peer that never
// beat is the bootstrap's deadline's to report, and failures of the store itself are skipped
// (the waits' deadlines notice those). The bound is `timeout` plus a period, not the
// milliseconds of tpcomm's own store.

/// `inner` with a heartbeat thread and a `RankWatch` (NOTE [heartbeat watch]). Forwards every
/// operation to `inner`.
std::shared_ptr<Store> with_heartbeat(std::shared_ptr<Store> inner, int rank, int world_size,
                                      Milliseconds timeout);

}  // namespace tpcomm
