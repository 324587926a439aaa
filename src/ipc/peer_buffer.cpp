// SPDX-License-Identifier: Apache-2.0
#include "ipc/peer_buffer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bootstrap/agree.hpp"
#include "core/cuda_check.hpp"
#include "core/cuda_driver.hpp"
#include "core/log.hpp"

namespace tpcomm {

std::uint64_t process_nonce() noexcept {
  static const std::uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(getpid());
  }();
  return nonce;
}

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(BufferRecord::handle));

PeerMappings::~PeerMappings() { close(); }

void PeerMappings::close() noexcept {
  for (auto& [handle, base] : opened_) cudaIpcCloseMemHandle(base);
  opened_.clear();
}

BufferRecord PeerMappings::describe(const void* ptr, int device, int node) {
  const CudaDriver& cu = CudaDriver::get();
  CUdeviceptr base = 0;
  std::size_t size = 0;
  const auto p = reinterpret_cast<CUdeviceptr>(ptr);
  if (CUresult r = cu.cuMemGetAddressRange(&base, &size, p); r != CUDA_SUCCESS)
    TPCOMM_THROW(Status::kCudaError, "finding the allocation of a buffer: ", cu.error_string(r));
  BufferRecord record;
  record.nonce = process_nonce();
  record.ptr = p;
  record.offset = p - base;
  record.node = node;
  record.device = device;
  cudaIpcMemHandle_t handle;
  TPCOMM_CUDA_CHECK(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)));
  std::memcpy(record.handle.data(), &handle, sizeof(handle));
  return record;
}

void* PeerMappings::map(const BufferRecord& record, int node) {
  if (record.nonce == process_nonce()) {
    if (record.device != device_) {
      int can = 0;
      cudaDeviceCanAccessPeer(&can, device_, record.device);
      const cudaError_t e =
          can ? cudaDeviceEnablePeerAccess(record.device, 0) : cudaErrorPeerAccessUnsupported;
      cudaGetLastError();
      TPCOMM_CHECK(e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled, Status::kUnavailable,
                   "no peer access from device ", device_, " to device ", record.device, ": ",
                   cudaGetErrorString(e));
    }
    return reinterpret_cast<void*>(record.ptr);
  }
  TPCOMM_CHECK(record.node == node, Status::kUnavailable,
               "a buffer on another node: peer memory spans one node");
  auto it = opened_.find(record.handle);
  if (it == opened_.end()) {
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, record.handle.data(), sizeof(handle));
    void* base = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
    cudaGetLastError();
    TPCOMM_CHECK(e == cudaSuccess, Status::kUnavailable,
                 "cannot open an IPC handle: ", cudaGetErrorString(e));
    it = opened_.emplace(record.handle, static_cast<char*>(base)).first;
  }
  return it->second + record.offset;
}

struct PeerBuffer::Impl {
  Bootstrap* boot = nullptr;
  int device = 0;
  std::size_t bytes = 0;
  void* local = nullptr;
  std::vector<void*> peers;
  std::unique_ptr<PeerMappings> mappings;

  void free_local() noexcept {
    if (local != nullptr) cudaFree(local);
    local = nullptr;
  }

  /// Closes the mappings, waits until no peer maps this rank's allocation, and frees it.
  void release() noexcept {
    if (mappings) mappings->close();
    // Nobody may free while a peer still has it mapped (CUDA IPC rule).
    try {
      boot->barrier();
    } catch (const Error& err) {
      TPCOMM_LOG_WARN("peer memory: barrier before freeing failed (", err.what(),
                      "); freeing anyway");
    }
    free_local();
  }
};

PeerBuffer::PeerBuffer(Bootstrap& boot, int device, std::size_t bytes)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.boot = &boot;
  m.device = device;
  m.bytes = bytes;
  m.mappings = std::make_unique<PeerMappings>(device);
  const int world = boot.world_size();
  DeviceGuard guard(device);

  // 1. Allocate and zero (before the exchange: no peer may see stale memory); all or none.
  struct Record {
    BufferRecord buffer;
    std::uint64_t bytes;
  } mine{};
  std::string local_error;
  cudaError_t e = cudaMalloc(&m.local, bytes);
  if (e == cudaSuccess) e = cudaMemset(m.local, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    cudaGetLastError();
    local_error = detail::concat("allocating ", bytes, " bytes: ", cudaGetErrorString(e));
  } else {
    try {
      mine.buffer = PeerMappings::describe(m.local, device, boot.node_id());
    } catch (const Error& err) {
      local_error = err.what();
    }
  }
  mine.bytes = bytes;
  if (std::string why = agree(boot, local_error); !why.empty()) {
    m.free_local();
    TPCOMM_THROW(Status::kUnavailable, "peer memory: ", why);
  }

  // 2. Exchange and map every peer; then agree that every mapping worked.
  const auto records = boot.all_gather_value(mine);
  m.peers.assign(static_cast<std::size_t>(world), nullptr);
  std::string map_error;
  for (int r = 0; r < world && map_error.empty(); ++r) {
    const Record& rec = records[static_cast<std::size_t>(r)];
    try {
      TPCOMM_CHECK(rec.bytes == bytes, Status::kInvalidArgument, "rank ", r, " asked for ",
                   rec.bytes, " bytes and this rank for ", bytes);
      m.peers[static_cast<std::size_t>(r)] =
          r == boot.rank() ? m.local : m.mappings->map(rec.buffer, boot.node_id());
    } catch (const Error& err) {
      map_error = err.what();
    }
  }
  if (std::string why = agree(boot, map_error); !why.empty()) {
    m.release();
    TPCOMM_THROW(Status::kUnavailable, "peer memory: ", why);
  }
}

PeerBuffer::~PeerBuffer() {
  if (!impl_ || impl_->local == nullptr) return;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(impl_->device);
  impl_->release();
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
