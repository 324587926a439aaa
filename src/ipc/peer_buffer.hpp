// SPDX-License-Identifier: Apache-2.0
// Symmetric device memory: one allocation of the same size per rank, every peer's mapped here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <type_traits>

#include "tpcomm/bootstrap.hpp"

namespace tpcomm {

/// What a rank tells its peers about one of its device buffers so that they can map it: raw
/// bytes through the bootstrap.
struct BufferRecord {
  std::uint64_t nonce = 0;   // `process_nonce()` of the rank that owns the buffer
  std::uint64_t ptr = 0;     // the buffer in the owner's address space
  std::uint64_t offset = 0;  // from the start of its allocation
  std::int32_t node = 0;
  std::int32_t device = 0;
  std::array<char, 64> handle{};  // the allocation's cudaIpcMemHandle_t
};
static_assert(std::is_trivially_copyable_v<BufferRecord>);

/// Peers' buffers mapped into this rank: raw pointers from ranks of this process (peer access
/// enabled where the devices differ), CUDA IPC mappings from other processes of the node, each
/// allocation opened once and closed when this object is destroyed. Not thread-safe.
class PeerMappings {
 public:
  explicit PeerMappings(int device) : device_(device) {}
  ~PeerMappings();
  PeerMappings(const PeerMappings&) = delete;
  PeerMappings& operator=(const PeerMappings&) = delete;

  /// The record of `ptr`, any address inside a device allocation of `device`, for peers on
  /// node `node`. Throws `Error(kCudaError)`.
  static BufferRecord describe(const void* ptr, int device, int node);

  /// The buffer `record` describes, as mapped here (`record.ptr` itself for a rank of this
  /// process). Throws `Error(kUnavailable)` when it cannot be mapped: another node, no peer
  /// access between the devices, a handle that does not open.
  void* map(const BufferRecord& record, int node);

  /// Closes every IPC mapping now (peers may free their allocations afterwards).
  void close() noexcept;

 private:
  int device_;
  std::map<std::array<char, 64>, char*> opened_;  // allocation handle -> its base, mapped here
};

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
