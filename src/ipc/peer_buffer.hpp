// SPDX-License-Identifier: Apache-2.0
// Symmetric device memory: one allocation of the same size per rank, every peer's mapped here.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "tpcomm/bootstrap.hpp"

namespace tpcomm {

/// One zero-filled device allocation per rank, all the same size, with every peer's allocation
/// mapped into this rank's address space.
///
/// Ranks that are threads of one process exchange raw pointers (enabling peer access when the
/// devices differ); ranks in different processes of one node exchange CUDA IPC handles as bytes
/// through the bootstrap. Ranks on different nodes are refused (`Error(kUnavailable)`).
/// Construction and destruction are collective: handles are closed everywhere before any rank
/// frees its allocation. Move-only.
class PeerBuffer {
 public:
  /// Allocates `bytes` on `device` and exchanges the mappings. Collective over `boot`, which
  /// must outlive the buffer.
  PeerBuffer(Bootstrap& boot, int device, std::size_t bytes);
  ~PeerBuffer();
  PeerBuffer(PeerBuffer&&) noexcept;
  PeerBuffer& operator=(PeerBuffer&&) = delete;
  PeerBuffer(const PeerBuffer&) = delete;
  PeerBuffer& operator=(const PeerBuffer&) = delete;

  [[nodiscard]] void* local() const noexcept;
  /// Rank `rank`'s allocation as mapped here (`local()` for this rank).
  [[nodiscard]] void* peer(int rank) const noexcept;
  [[nodiscard]] std::size_t bytes() const noexcept;
  [[nodiscard]] int world_size() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A random number fixed for the life of this process: tells "same process" apart from "same
/// pid in another container".
std::uint64_t process_nonce() noexcept;

}  // namespace tpcomm
