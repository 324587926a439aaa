// SPDX-License-Identifier: Apache-2.0
// The TCP store server's requests: the key-value operations, the waits for keys, the rank watch.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>

#include "bootstrap/deadline.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/tcp_store_server_impl.hpp"
#include "bootstrap/wire.hpp"
#include "core/check.hpp"
#include "core/log.hpp"

namespace tpcomm {
namespace {

using detail::concat;
using net::Io;
using net::IoResult;
using std::chrono::milliseconds;
using wire::Opcode;
using wire::ReplyCode;

// How often a GET/WAIT that waits for its key checks whether its client hung up.
constexpr milliseconds kHangupPollInterval{100};
// How often a watch connection checks for a lost rank to report and for its client hanging up
// (NOTE [rank watch]); a lost rank reaches the other ranks within about this long.
constexpr milliseconds kWatchPoll{20};

}  // namespace

TcpStoreServer::Impl::WaitResult TcpStoreServer::Impl::wait_for_key(int fd, const std::string& key,
                                                                    std::int64_t timeout_ms,
                                                                    Bytes* out, Held& held) {
  const Deadline deadline = deadline_after(milliseconds{timeout_ms});
  waiting.fetch_add(1);
  struct Leave {
    std::atomic<int>& n;
    ~Leave() { n.fetch_sub(1); }
  } leave{waiting};
  std::unique_lock lock(data_mu);
  Deadline next_poll = SteadyClock::now() + kHangupPollInterval;
  for (;;) {
    if (auto it = data.find(key); it != data.end()) {
      if (out == nullptr) return WaitResult::kFound;
      if (!held.take(it->second.size())) return WaitResult::kOverLimit;
      *out = it->second;
      return WaitResult::kFound;
    }
    if (stopping.load()) return WaitResult::kGone;
    if (!lost.empty()) return WaitResult::kRankLost;
    const auto now = SteadyClock::now();
    if (now >= deadline) return WaitResult::kTimeout;
    if (now >= next_poll) {
      // A client that died while waiting must not pin this thread until the timeout.
      lock.unlock();
      const bool gone = net::peer_hung_up(fd);
      lock.lock();
      if (gone) return WaitResult::kGone;
      next_poll = now + kHangupPollInterval;
      continue;
    }
    data_cv.wait_until(lock, std::min(deadline, next_poll));
  }
}

std::optional<wire::Rejection> TcpStoreServer::Impl::over_stored_limits(
    std::string_view op, const std::string& key,
    std::unordered_map<std::string, Bytes>::const_iterator it, std::size_t value_bytes) const {
  const bool is_new = it == data.end();
  if (is_new && data.size() >= config.max_keys) {
    return wire::Rejection{ReplyCode::kOverLimit,
                           concat(op, " of a new key: the store holds its max_keys of ",
                                  config.max_keys, " keys; key ", wire::quote_key(key))};
  }
  const std::size_t freed = is_new ? 0 : key.size() + it->second.size();
  const std::size_t needed = key.size() + value_bytes;
  if (needed > config.max_stored_bytes - (stored - freed)) {
    return wire::Rejection{
        ReplyCode::kOverLimit,
        concat(op, " of ", needed, " bytes (key and value) would take the store over its ",
               "max_stored_bytes of ", config.max_stored_bytes, " (it holds ", stored, "); key ",
               wire::quote_key(key))};
  }
  return std::nullopt;
}

std::optional<wire::Rejection> TcpStoreServer::Impl::set(const std::string& key, Bytes&& value) {
  {
    std::lock_guard lock(data_mu);
    auto it = data.find(key);
    if (auto why = over_stored_limits("SET", key, it, value.size())) return why;
    if (it == data.end()) {
      stored += key.size() + value.size();
      data.emplace(key, std::move(value));
    } else {
      stored = stored - it->second.size() + value.size();
      it->second = std::move(value);
    }
  }
  data_cv.notify_all();
  return std::nullopt;
}

std::optional<wire::Rejection> TcpStoreServer::Impl::add(const std::string& key, std::int64_t delta,
                                                         std::int64_t& result) {
  std::string error;
  {
    std::lock_guard lock(data_mu);
    auto it = data.find(key);
    const bool inserted = it == data.end();
    if (inserted) {
      if (auto why = over_stored_limits("ADD", key, it, sizeof(std::int64_t))) return why;
      it = data.try_emplace(key).first;
      stored += key.size();
    }
    std::optional<std::int64_t> current =
        inserted ? std::optional<std::int64_t>(0) : wire::decode_counter(it->second);
    if (!current) {
      error = concat("ADD on key ", wire::quote_key(key), ", which holds a value of ",
                     it->second.size(), " bytes, not a counter (8 bytes)");
    } else if (std::int64_t sum = 0; __builtin_add_overflow(*current, delta, &sum)) {
      error = concat("ADD of ", delta, " to key ", wire::quote_key(key), ", which holds ", *current,
                     ", overflows a 64-bit counter (the counter is unchanged)");
    } else {
      result = sum;
      auto bytes = wire::encode_counter(result);
      stored = stored - it->second.size() + bytes.size();
      it->second.assign(bytes.begin(), bytes.end());
    }
  }
  if (!error.empty()) return wire::Rejection{ReplyCode::kInvalidArgument, error};
  data_cv.notify_all();
  return std::nullopt;
}

bool TcpStoreServer::Impl::handle(Connection& c, const wire::RequestHeader& h,
                                  const std::string& key, Bytes& value) {
  const int fd = c.sock.get();
  wire::ReplyHeader reply;
  Bytes payload;
  Held held(*this);
  // An error reply's reason, cut to what a client accepts (it may quote a long key).
  auto fail = [&](ReplyCode code, const std::string& reason) {
    if (code == ReplyCode::kOverLimit && reply.result != wire::kRetryLater) {
      rejected.fetch_add(1);
      TPCOMM_LOG_WARN("store: refused a request from ", c.peer, ": ", reason);
    }
    reply.code = code;
    const std::size_t n = std::min(reason.size(), wire::kMaxReasonBytes);
    payload.resize(n);
    std::memcpy(payload.data(), reason.data(), n);
  };
  switch (h.opcode) {
    case Opcode::kSet: {
      if (auto why = set(key, std::move(value))) fail(why->code, why->reason);
      break;
    }
    case Opcode::kGet:
    case Opcode::kWait: {
      Bytes* out = h.opcode == Opcode::kGet ? &payload : nullptr;
      switch (wait_for_key(fd, key, h.arg, out, held)) {
        case WaitResult::kFound:
          break;
        case WaitResult::kTimeout:
          reply.code = ReplyCode::kTimeout;
          break;
        case WaitResult::kGone:
          return false;
        case WaitResult::kOverLimit: {
          const std::string reason = concat("GET ", wire::quote_key(key),
                                            ": its value would take the bytes the store holds in ",
                                            "flight over its max_inflight_bytes of ",
                                            config.max_inflight_bytes, "; try again later");
          note_retry_later(c, reason);
          reply.result = wire::kRetryLater;
          fail(ReplyCode::kOverLimit, reason);
          break;
        }
        case WaitResult::kRankLost: {
          std::string reason;
          {
            std::lock_guard lock(data_mu);
            reason = lost;
          }
          fail(ReplyCode::kRankLost, reason);
          break;
        }
      }
      break;
    }
    case Opcode::kAdd: {
      if (auto why = add(key, h.arg, reply.result)) fail(why->code, why->reason);
      break;
    }
    case Opcode::kCheck: {
      std::lock_guard lock(data_mu);
      reply.result = data.contains(key) ? 1 : 0;
      break;
    }
    case Opcode::kErase: {
      std::lock_guard lock(data_mu);
      if (auto it = data.find(key); it != data.end()) {
        stored -= key.size() + it->second.size();
        data.erase(it);
        reply.result = 1;
      }
      break;
    }
    case Opcode::kWatch:
      return watch(c, h.arg, value);
    case Opcode::kClaim: {
      if (auto why = claim(c, h.arg, payload)) {
        rejected.fetch_add(1);
        TPCOMM_LOG_WARN("store: refused a rank's claim from ", c.peer, ": ", *why);
        fail(ReplyCode::kRefused, *why);
      }
      break;
    }
    case Opcode::kHello:
      break;
  }
  reply.value_len = payload.size();
  return send_reply(fd, reply, payload);
}

void TcpStoreServer::Impl::mark_lost(std::int64_t rank, const std::string& reason) {
  {
    std::lock_guard lock(data_mu);
    if (!lost.empty()) return;
    lost = reason;
    lost_rank = rank;
  }
  TPCOMM_LOG_WARN("store: ", reason, "; waits for keys fail from now on");
  data_cv.notify_all();
}

std::optional<std::string> TcpStoreServer::Impl::refuse_rank(std::int64_t rank) const {
  if (!config.watch_ranks) {
    return concat("rank ", rank,
                  ": this store takes no rank watches (its job runs with TPCOMM_RANK_WATCH=0)");
  }
  if (config.world_size <= 0) {
    return concat("rank ", rank,
                  ": this store does not know the job's world size, so it takes no rank watches "
                  "(start it with tpcomm store --world-size N)");
  }
  if (rank >= config.world_size) {
    return concat("rank ", rank, " is not a rank of this job (world size ", config.world_size, ")");
  }
  return std::nullopt;
}

std::string TcpStoreServer::Impl::taken(std::int64_t rank, const RankSlot& slot) const {
  switch (slot.state) {
    case RankSlot::State::kClaimed:
    case RankSlot::State::kWatched:
      return concat("rank ", rank, " is held by the connection from ", slot.peer,
                    " (two processes started as rank ", rank, "?)");
    case RankSlot::State::kLeft:
      return concat("rank ", rank, " left the job");
    case RankSlot::State::kLost:
      return concat("rank ", rank, " is lost (", lost, ")");
  }
  return concat("rank ", rank, " is taken");
}

std::optional<std::string> TcpStoreServer::Impl::claim(Connection& c, std::int64_t rank,
                                                       Bytes& secret) {
  if (auto why = refuse_rank(rank)) return why;
  if (c.claimed >= 0)
    return concat("rank ", rank, ": this connection stands for rank ", c.claimed, " already");
  RankSlot slot{.owner = c.id, .peer = c.peer};
  std::random_device random;
  for (std::size_t i = 0; i < slot.secret.size(); i += sizeof(unsigned)) {
    const unsigned word = random();
    std::memcpy(slot.secret.data() + i, &word, std::min(sizeof(word), slot.secret.size() - i));
  }
  {
    std::lock_guard lock(data_mu);
    auto [it, inserted] = ranks.try_emplace(rank, slot);
    if (!inserted) return taken(rank, it->second);
  }
  c.claimed = rank;
  c.use.store(Use::kRank);
  secret.assign(slot.secret.begin(), slot.secret.end());
  TPCOMM_LOG_DEBUG("store: ", c.peer, " stands for rank ", rank);
  return std::nullopt;
}

void TcpStoreServer::Impl::release_claim(const Connection& c) {
  if (c.claimed < 0) return;
  std::lock_guard lock(data_mu);
  // A claim no watch took up: the rank's process went before its watch, and nothing was lost.
  if (auto it = ranks.find(c.claimed); it != ranks.end() &&
                                       it->second.state == RankSlot::State::kClaimed &&
                                       it->second.owner == c.id)
    ranks.erase(it);
}

bool TcpStoreServer::Impl::watch(Connection& c, std::int64_t rank,
                                 std::span<const std::byte> secret) {
  const int fd = c.sock.get();
  if (rank < 0) {
    reject(c, ReplyCode::kProtocolError, "WATCH -1 (leaving) on a connection that watches no rank");
    return false;
  }
  // Only the connection that claimed the rank knows its secret; a watch of a rank that is not
  // the job's, not claimed, held or gone is refused, and closing it then loses nothing (NOTE
  // [rank watch]).
  std::optional<std::string> why = refuse_rank(rank);
  if (!why) {
    std::lock_guard lock(data_mu);
    auto it = ranks.find(rank);
    if (it == ranks.end()) {
      why = concat("rank ", rank, " has not claimed its watch over its own connection (CLAIM)");
    } else if (it->second.state != RankSlot::State::kClaimed) {
      why = taken(rank, it->second);
    } else if (!token_matches(
                   secret, std::string_view(reinterpret_cast<const char*>(it->second.secret.data()),
                                            it->second.secret.size()))) {
      why = concat("WATCH of rank ", rank,
                   " with the wrong secret: only the connection that "
                   "claimed the rank gets it");
    } else {
      it->second.state = RankSlot::State::kWatched;
    }
  }
  if (why) {
    reject(c, ReplyCode::kRefused, *why);
    return false;
  }
  c.use.store(Use::kRank);
  watchers.fetch_add(1);
  struct Leave {
    Impl& m;
    std::int64_t rank;
    // What the watch ended as: the rank left normally (kLeft), was lost (kLost), or the reply
    // accepting the watch never went out (kClaimed: its client may try again).
    RankSlot::State end = RankSlot::State::kClaimed;
    ~Leave() {
      m.watchers.fetch_sub(1);
      std::lock_guard lock(m.data_mu);
      if (auto it = m.ranks.find(rank); it != m.ranks.end()) it->second.state = end;
    }
  } leave{*this, rank};
  if (!send_reply(fd, wire::ReplyHeader{}, {})) return false;
  // From here on a stopping server leaves the rank watched: nobody claims it again.
  leave.end = RankSlot::State::kWatched;
  TPCOMM_LOG_DEBUG("store: ", c.peer, " watches as rank ", rank);
  bool told = false;
  for (;;) {
    std::string notice;
    std::int64_t notice_rank = -1;
    if (!told) {
      std::lock_guard lock(data_mu);
      if (!lost.empty() && lost_rank != rank) {
        notice = lost;
        notice_rank = lost_rank;
        told = true;
      }
    }
    if (!notice.empty()) {
      // A failed send means the client is gone too: the next poll sees it.
      send_reply(
          fd,
          wire::ReplyHeader{
              .code = ReplyCode::kRankLost, .value_len = notice.size(), .result = notice_rank},
          wire::as_bytes(notice));
    }
    if (stopping.load()) {
      send_reply(fd, wire::ReplyHeader{.result = -1}, {});  // a normal end, not a lost host
      return false;
    }
    IoResult w = net::wait_readable(fd, deadline_after(kWatchPoll));
    if (w.status == Io::kTimeout) continue;
    wire::RequestBytes hb;
    IoResult r =
        w.status == Io::kOk ? net::recv_all(fd, hb, deadline_after(config.frame_timeout)) : w;
    if (stopping.load()) return false;
    if (r.status != Io::kOk) {
      leave.end = RankSlot::State::kLost;
      mark_lost(rank, concat("rank ", rank, " left: its connection to the store closed"));
      return false;
    }
    const wire::RequestHeader h = wire::decode_request(hb);
    if (!wire::check_request(h, limits) && h.opcode == Opcode::kWatch && h.arg == -1) {
      leave.end = RankSlot::State::kLeft;
      TPCOMM_LOG_DEBUG("store: rank ", rank, " left normally");
      return false;
    }
    leave.end = RankSlot::State::kLost;
    mark_lost(rank, concat("rank ", rank, " left: its watch connection broke the protocol"));
    reject(c, ReplyCode::kProtocolError, "a watch connection sends nothing but WATCH -1");
    return false;
  }
}

}  // namespace tpcomm
