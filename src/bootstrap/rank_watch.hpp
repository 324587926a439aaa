// SPDX-License-Identifier: Apache-2.0
// Who of the job's ranks is gone: what a store client's watch connection learned, handed to
// the groups that must give up (NOTE [rank watch]).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace tpcomm {

// NOTE [rank watch]
// Every rank of a multi-process job keeps a second connection to the store, its watch
// connection, on which it has told the server its job rank (WATCH). A process that dies loses
// its sockets at once, so the server sees that connection close without the WATCH -1 by which a
// rank leaves normally, and then (a) answers every GET/WAIT that waits for a key, now and later,
// with kRankLost instead of letting it run to its timeout, and (b) sends a notice to every other
// watch connection. Each client hands the notice to its `RankWatch`, whose subscribers (the
// groups) make their kernels give up and their next call fail with kAborted. A client whose own
// watch connection closes without the server's stop notice has lost the store's host (rank 0,
// or a standalone `tpcomm store`): it reports rank -1, which every subscriber takes as its own.
// A job's first lost rank is the one reported; the job cannot go on without it.
//
// Only a rank's own process can watch as that rank, so a client that is no rank cannot make a
// rank look lost, nor keep one out:
// 1. A rank first claims its place over its request connection (CLAIM r). The server takes the
//    claim only where the job watches its ranks (its host's TPCOMM_RANK_WATCH), only of ranks
//    below the job's world size (0 when unknown: a `tpcomm store` without --world-size takes
//    none), and only of a rank that no open connection holds and that has not left or been
//    lost; it answers with a random secret that no other request returns.
// 2. The watch connection presents that secret (WATCH r, secret). A watch of a rank not claimed,
//    with another secret, of a rank watched already, left or lost, is refused naming why, and
//    closing that connection marks nothing lost.
// 3. A claim whose connection closes before a watch took it up is given back; once watched, the
//    rank's place ends with its watch: left (WATCH -1) or lost (closed without it). Neither can
//    be claimed again, so a client that watches a rank after it left loses nothing.
// The claim is first come, first served: the store cannot tell which process a launcher started
// as rank r. A client that speaks the protocol and claims rank r before rank r does (any client
// of a store without a token, or any holder of the token) still keeps rank r out, which then
// fails its setup naming the connection that holds it: the token (TPCOMM_STORE_TOKEN) is what
// keeps other processes out, as for every key of the store.

/// The first lost rank of a job, as a client learned it, and who wants to know.
/// Thread-safe.
class RankWatch {
 public:
  /// `rank` is the job rank that left, or -1 for the store's host; `reason` says what happened.
  using Callback = std::function<void(int rank, const std::string& reason)>;

  struct Lost {
    int rank = -1;
    std::string reason;
  };

  /// Calls `cb` (from the watching thread) when a rank is lost, or at once when one already is.
  /// `cb` must be short and must not call back into this watch. Returns the id to unsubscribe.
  std::uint64_t subscribe(Callback cb);
  /// After this returns, the callback of `id` is not running and will not run again.
  void unsubscribe(std::uint64_t id) noexcept;
  /// Records the loss (the first one only) and calls every subscriber.
  void notify(int rank, const std::string& reason);
  [[nodiscard]] std::optional<Lost> lost() const;

 private:
  mutable std::mutex mu_;
  std::optional<Lost> lost_;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Callback> subscribers_;
};

}  // namespace tpcomm
