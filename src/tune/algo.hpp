// SPDX-License-Identifier: Apache-2.0
// The all-reduce algorithms of the custom backend and one launch configuration of them.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "ipc/layout.hpp"

namespace tpcomm {

/// A custom all-reduce algorithm, or none (the request goes to the next backend, NCCL).
enum class Algo : std::uint8_t {
  /// Not served by the custom kernels.
  kNone,
  /// Barrier, then every rank reads every peer's input and writes the full sum.
  kOneShot,
  /// Reduce-scatter, barrier, all-gather: about 2n bytes moved per rank.
  kTwoShot,
  /// Every rank pushes its input into every peer's receive buffer; the data is the flag, no
  /// barrier. f16 and bf16 only, up to the Lamport buffers' size.
  kLamport,
  /// Rank s reduces slice s of every rank's pushed input and pushes the sum to every rank; no
  /// barrier either, about 2n bytes sent per rank. f16 and bf16 only, up to the Lamport
  /// buffers' size.
  kLamportTwoShot,
};

/// True for the algorithms that push into the Lamport buffers (and so never read the caller's
/// buffers from a peer).
constexpr bool is_lamport(Algo a) noexcept {
  return a == Algo::kLamport || a == Algo::kLamportTwoShot;
}

/// True when Lamport algorithm `a` can carry a message of `bytes` bytes among `world_size` ranks
/// in receive slots of `slot_bytes` bytes; false for the other algorithms.
constexpr bool lamport_fits(Algo a, std::int64_t bytes, int world_size,
                            std::int64_t slot_bytes) noexcept {
  if (a == Algo::kLamport) return bytes <= slot_bytes;
  if (a == Algo::kLamportTwoShot)
    return lamport_two_shot_slot_bytes(bytes, world_size) <= slot_bytes;
  return false;
}

/// "none", "one_shot", "two_shot", "lamport", "lamport_two_shot".
constexpr std::string_view to_string(Algo a) noexcept {
  switch (a) {
    case Algo::kNone:
      return "none";
    case Algo::kOneShot:
      return "one_shot";
    case Algo::kTwoShot:
      return "two_shot";
    case Algo::kLamport:
      return "lamport";
    case Algo::kLamportTwoShot:
      return "lamport_two_shot";
  }
  return "unknown";
}

/// The inverse of `to_string(Algo)`; exact names only, nullopt for anything else.
constexpr std::optional<Algo> parse_algo(std::string_view s) noexcept {
  for (Algo a :
       {Algo::kNone, Algo::kOneShot, Algo::kTwoShot, Algo::kLamport, Algo::kLamportTwoShot})
    if (to_string(a) == s) return a;
  return std::nullopt;
}

/// Most blocks a launch shape may name (a tuned table is checked against this). A group clamps
/// every choice to what its kernels can launch, `SelectorCaps::max_blocks`, which is at most
/// the number of blocks its signal pads are sized for (`kMaxBlocks` in ipc/layout.hpp, 64).
inline constexpr int kMaxBlocksPerRank = 128;

/// True for the block sizes the kernels are built for: 64, 128, 256, 512 or 1024 threads.
constexpr bool is_valid_threads(int threads) noexcept {
  return threads == 64 || threads == 128 || threads == 256 || threads == 512 || threads == 1024;
}

/// An algorithm and its launch shape: `blocks` per rank's kernel, `threads` per block.
///
/// For `Algo::kNone` both are 0. Otherwise `blocks` is in 1..`kMaxBlocksPerRank` and `threads`
/// satisfies `is_valid_threads`.
struct Choice {
  Algo algo = Algo::kNone;
  int blocks = 0;
  int threads = 0;

  friend bool operator==(const Choice&, const Choice&) = default;
};

/// True when `c` is a launch shape the kernels accept (see `Choice`).
constexpr bool is_valid(const Choice& c) noexcept {
  if (c.algo == Algo::kNone) return c.blocks == 0 && c.threads == 0;
  return c.blocks >= 1 && c.blocks <= kMaxBlocksPerRank && is_valid_threads(c.threads);
}

/// "one_shot 8x512" (blocks x threads), or "none".
inline std::string to_string(const Choice& c) {
  std::string s(to_string(c.algo));
  if (c.algo != Algo::kNone) s += ' ' + std::to_string(c.blocks) + 'x' + std::to_string(c.threads);
  return s;
}

inline std::ostream& operator<<(std::ostream& os, Algo a) { return os << to_string(a); }
inline std::ostream& operator<<(std::ostream& os, const Choice& c) { return os << to_string(c); }

}  // namespace tpcomm
