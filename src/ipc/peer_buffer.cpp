// SPDX-License-Identifier: Apache-2.0
#include "ipc/peer_buffer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/log.hpp"

namespace tpcomm {

std::uint64_t process_nonce() noexcept {
  static const std::uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(getpid());
  }();
  return nonce;
}

namespace {

/// What each rank tells the others about its allocation (raw bytes through the bootstrap).
struct PeerRecord {
  std::uint64_t nonce;
  std::uint64_t ptr;
  std::uint64_t bytes;
  std::int32_t node;
  std::int32_t device;
  cudaIpcMemHandle_t handle;
  std::int32_t ok;
  std::array<char, 124> why;
};
static_assert(std::is_trivially_copyable_v<PeerRecord>);

void set_why(PeerRecord& r, const std::string& why) {
  r.ok = 0;
  std::snprintf(r.why.data(), r.why.size(), "%s", why.c_str());
}

/// Throws the same error on every rank when any record reports a failure.
void throw_if_any_failed(const std::vector<PeerRecord>& records) {
  for (std::size_t r = 0; r < records.size(); ++r) {
    if (records[r].ok == 0)
      TPCOMM_THROW(Status::kUnavailable, "peer memory: rank ", r, ": ", records[r].why.data());
  }
}

}  // namespace

struct PeerBuffer::Impl {
  Bootstrap* boot = nullptr;
  int device = 0;
  std::size_t bytes = 0;
  void* local = nullptr;
  std::vector<void*> peers;
  std::vector<bool> opened;

  void close_handles() noexcept {
    for (std::size_t r = 0; r < peers.size(); ++r) {
      if (opened[r] && peers[r] != nullptr) cudaIpcCloseMemHandle(peers[r]);
      opened[r] = false;
    }
  }
  void free_local() noexcept {
    if (local != nullptr) cudaFree(local);
    local = nullptr;
  }
};

PeerBuffer::PeerBuffer(Bootstrap& boot, int device, std::size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.boot = &boot;
  m.device = device;
  m.bytes = bytes;
  const int world = boot.world_size();
  const int me = boot.rank();
  DeviceGuard guard(device);

  // 1. Allocate and zero (before the exchange: no peer may see stale memory).
  PeerRecord mine{};
  mine.nonce = process_nonce();
  mine.bytes = bytes;
  mine.node = boot.node_id();
  mine.device = device;
  mine.ok = 1;
  cudaError_t e = cudaMalloc(&m.local, bytes);
  if (e == cudaSuccess) e = cudaMemset(m.local, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.handle, m.local);
  if (e != cudaSuccess) {
    cudaGetLastError();
    set_why(mine, std::string("allocating ") + std::to_string(bytes) +
                      " bytes: " + cudaGetErrorString(e));
  }
  mine.ptr = reinterpret_cast<std::uint64_t>(m.local);

  // 2. Exchange; a failure anywhere fails every rank the same way.
  const auto records = boot.all_gather_value(mine);
  try {
    throw_if_any_failed(records);
    for (int r = 0; r < world; ++r)
      TPCOMM_CHECK(records[r].bytes == bytes, Status::kInvalidArgument, "peer memory: rank ", r,
                   " asked for ", records[r].bytes, " bytes and rank ", me, " for ", bytes);
  } catch (...) {
    m.free_local();
    throw;
  }

  // 3. Map every peer; then agree that all mappings worked.
  m.peers.assign(world, nullptr);
  m.opened.assign(world, false);
  PeerRecord verdict{};
  verdict.ok = 1;
  for (int r = 0; r < world && verdict.ok != 0; ++r) {
    const PeerRecord& rec = records[r];
    if (r == me) {
      m.peers[r] = m.local;
    } else if (rec.nonce == mine.nonce) {
      m.peers[r] = reinterpret_cast<void*>(rec.ptr);
      if (rec.device != device) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, device, rec.device);
        cudaError_t pe =
            can ? cudaDeviceEnablePeerAccess(rec.device, 0) : cudaErrorPeerAccessUnsupported;
        if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) {
          set_why(verdict, "no peer access from device " + std::to_string(device) + " to device " +
                               std::to_string(rec.device) + ": " + cudaGetErrorString(pe));
        }
        cudaGetLastError();
      }
    } else if (rec.node == mine.node) {
      void* p = nullptr;
      cudaError_t oe = cudaIpcOpenMemHandle(&p, rec.handle, cudaIpcMemLazyEnablePeerAccess);
      if (oe == cudaSuccess) {
        m.peers[r] = p;
        m.opened[r] = true;
      } else {
        cudaGetLastError();
        set_why(verdict, "cannot open the IPC handle of rank " + std::to_string(r) + ": " +
                             cudaGetErrorString(oe));
      }
    } else {
      set_why(verdict,
              "rank " + std::to_string(r) + " is on another node; peer memory spans one node");
    }
  }
  const auto verdicts = boot.all_gather_value(verdict);
  for (const PeerRecord& v : verdicts) {
    if (v.ok == 0) {
      m.close_handles();
      try {
        boot.barrier();
      } catch (const Error& err) {
        TPCOMM_LOG_WARN("peer memory: barrier before freeing failed: ", err.what());
      }
      m.free_local();
      throw_if_any_failed(verdicts);
    }
  }
}

PeerBuffer::~PeerBuffer() {
  if (!impl_ || impl_->local == nullptr) return;
  Impl& m = *impl_;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(m.device);
  m.close_handles();
  // Nobody may free while a peer still has it mapped (CUDA IPC rule).
  try {
    m.boot->barrier();
  } catch (const Error& err) {
    TPCOMM_LOG_WARN("peer memory: barrier before freeing failed (", err.what(),
                    "); freeing anyway");
  }
  m.free_local();
  cudaSetDevice(previous);
}

PeerBuffer::PeerBuffer(PeerBuffer&&) noexcept = default;

void* PeerBuffer::local() const noexcept { return impl_->local; }
void* PeerBuffer::peer(int rank) const noexcept {
  return impl_->peers[static_cast<std::size_t>(rank)];
}
std::size_t PeerBuffer::bytes() const noexcept { return impl_->bytes; }
int PeerBuffer::world_size() const noexcept { return static_cast<int>(impl_->peers.size()); }

}  // namespace tpcomm
