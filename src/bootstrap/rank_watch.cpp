// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/rank_watch.hpp"

#include "core/log.hpp"

namespace tpcomm {

std::uint64_t RankWatch::subscribe(Callback cb) {
  std::lock_guard lock(mu_);
  const std::uint64_t id = next_id_++;
  if (lost_) cb(lost_->rank, lost_->reason);
  subscribers_.emplace(id, std::move(cb));
  return id;
}

void RankWatch::unsubscribe(std::uint64_t id) noexcept {
  std::lock_guard lock(mu_);  // waits for a running callback: they run under the lock
  subscribers_.erase(id);
}

void RankWatch::notify(int rank, const std::string& reason) {
  std::lock_guard lock(mu_);
  if (lost_) return;
  lost_ = Lost{rank, reason};
  TPCOMM_LOG_ERROR(reason);
  for (auto& [id, cb] : subscribers_) cb(rank, reason);
}

std::optional<RankWatch::Lost> RankWatch::lost() const {
  std::lock_guard lock(mu_);
  return lost_;
}

}  // namespace tpcomm
