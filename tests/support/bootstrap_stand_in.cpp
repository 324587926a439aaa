// SPDX-License-Identifier: Apache-2.0
// A minimal `Bootstrap` for ranks that are threads of the test process: `in_process`, `rank`,
// `world_size` and `broadcast`, nothing else. tests/CMakeLists.txt compiles it into the gpu
// tier only while tpcomm_core has no bootstrap implementation of its own (no sources under
// src/bootstrap/); once it has one, this file is not built.
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/status.hpp"

namespace tpcomm {

struct Bootstrap::Impl {
  /// State shared by the ranks of one `in_process` group: broadcast payloads by sequence
  /// number (every rank calls collectives in the same order, so numbers agree).
  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::int64_t, Bytes> broadcasts;
  };
  std::shared_ptr<Shared> shared;
  int rank = 0;
  int world_size = 1;
  std::int64_t sequence = 0;
  Milliseconds timeout{30000};
};

Bootstrap::Bootstrap(std::shared_ptr<Store>, int rank, int world_size, int, int, std::string)
    : impl_(std::make_unique<Impl>()) {
  impl_->rank = rank;
  impl_->world_size = world_size;
}

Bootstrap::~Bootstrap() = default;
Bootstrap::Bootstrap(Bootstrap&&) noexcept = default;
Bootstrap& Bootstrap::operator=(Bootstrap&&) noexcept = default;

std::vector<Bootstrap> Bootstrap::in_process(int world_size, Milliseconds timeout) {
  auto shared = std::make_shared<Impl::Shared>();
  std::vector<Bootstrap> out;
  for (int r = 0; r < world_size; ++r) {
    Bootstrap b(nullptr, r, world_size, r, world_size, "tpcomm");
    b.impl_->shared = shared;
    b.impl_->timeout = timeout;
    out.push_back(std::move(b));
  }
  return out;
}

int Bootstrap::rank() const noexcept { return impl_->rank; }
int Bootstrap::world_size() const noexcept { return impl_->world_size; }
Milliseconds Bootstrap::timeout() const noexcept { return impl_->timeout; }

Bytes Bootstrap::broadcast(std::span<const std::byte> data, int root) {
  Impl::Shared& s = *impl_->shared;
  const std::int64_t sequence = impl_->sequence++;
  std::unique_lock lock(s.mutex);
  if (impl_->rank == root) {
    s.broadcasts[sequence] = Bytes(data.begin(), data.end());
    s.changed.notify_all();
    return s.broadcasts[sequence];
  }
  const bool arrived =
      s.changed.wait_for(lock, impl_->timeout, [&] { return s.broadcasts.count(sequence) != 0; });
  if (!arrived) {
    throw Error(Status::kTimeout, "bootstrap stand-in: rank " + std::to_string(root) +
                                      " did not broadcast within the timeout");
  }
  return s.broadcasts[sequence];
}

}  // namespace tpcomm
