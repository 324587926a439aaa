// SPDX-License-Identifier: Apache-2.0
// The store for ranks that are threads of one process: a map under a mutex and a condition
// variable, with the TCP store's semantics and errors.
#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "bootstrap/deadline.hpp"
#include "bootstrap/wire.hpp"
#include "core/check.hpp"
#include "tpcomm/store.hpp"

namespace tpcomm {
namespace {

using detail::concat;

// The TCP store's limits, so that both stores accept and refuse the same keys and values.
const TcpStoreServerConfig kLimits{};

void check_key(std::string_view what, std::string_view key) {
  TPCOMM_CHECK(!key.empty(), Status::kInvalidArgument, what, ": empty key");
  TPCOMM_CHECK(key.size() <= kLimits.max_key_bytes, Status::kInvalidArgument, what, ": key of ",
               key.size(), " bytes is longer than the limit of ", kLimits.max_key_bytes);
}

}  // namespace

struct InProcessStore::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<std::string, Bytes> data;

  // Waits until every key in `keys` exists or `deadline` passes; returns the first missing key
  // (nullptr when all exist). Called with `lock` held.
  const std::string* wait_all(std::unique_lock<std::mutex>& lock, std::span<const std::string> keys,
                              Deadline deadline) {
    for (;;) {
      const std::string* missing = nullptr;
      for (const std::string& k : keys) {
        if (!data.contains(k)) {
          missing = &k;
          break;
        }
      }
      if (missing == nullptr || SteadyClock::now() >= deadline) return missing;
      cv.wait_until(lock, deadline);
    }
  }
};

InProcessStore::InProcessStore() : impl_(std::make_unique<Impl>()) {}

InProcessStore::~InProcessStore() = default;

void InProcessStore::set(std::string_view key, std::span<const std::byte> value, Milliseconds) {
  const std::string what = concat("store set ", wire::quote_key(key));
  check_key(what, key);
  TPCOMM_CHECK(value.size() <= kLimits.max_value_bytes, Status::kInvalidArgument, what,
               ": value of ", value.size(), " bytes is longer than the limit of ",
               kLimits.max_value_bytes);
  {
    std::lock_guard lock(impl_->mu);
    impl_->data[std::string(key)].assign(value.begin(), value.end());
  }
  impl_->cv.notify_all();
}

Bytes InProcessStore::get(std::string_view key, Milliseconds timeout) {
  const std::string what = concat("store get ", wire::quote_key(key));
  check_key(what, key);
  const std::string k(key);
  std::unique_lock lock(impl_->mu);
  if (impl_->wait_all(lock, std::span(&k, 1), deadline_after(timeout)) != nullptr) {
    TPCOMM_THROW(Status::kTimeout, what, ": key not set within ", timeout.count(), " ms");
  }
  return impl_->data.at(k);
}

std::int64_t InProcessStore::add(std::string_view key, std::int64_t delta, Milliseconds) {
  const std::string what = concat("store add ", wire::quote_key(key));
  check_key(what, key);
  std::int64_t result = 0;
  {
    std::lock_guard lock(impl_->mu);
    auto [it, inserted] = impl_->data.try_emplace(std::string(key));
    auto current = inserted ? std::optional<std::int64_t>(0) : wire::decode_counter(it->second);
    if (!current) {
      TPCOMM_THROW(Status::kInvalidArgument, what, ": ADD on key ", wire::quote_key(key),
                   ", which holds a value of ", it->second.size(),
                   " bytes, not a counter (8 bytes)");
    }
    if (__builtin_add_overflow(*current, delta, &result)) {
      TPCOMM_THROW(Status::kInvalidArgument, what, ": ADD of ", delta, " to key ",
                   wire::quote_key(key), ", which holds ", *current,
                   ", overflows a 64-bit counter (the counter is unchanged)");
    }
    auto bytes = wire::encode_counter(result);
    it->second.assign(bytes.begin(), bytes.end());
  }
  impl_->cv.notify_all();
  return result;
}

void InProcessStore::wait(std::span<const std::string> keys, Milliseconds timeout) {
  for (const std::string& k : keys) check_key(concat("store wait ", wire::quote_key(k)), k);
  std::unique_lock lock(impl_->mu);
  if (const std::string* missing = impl_->wait_all(lock, keys, deadline_after(timeout))) {
    TPCOMM_THROW(Status::kTimeout, "store wait ", wire::quote_key(*missing),
                 ": key not set within ", timeout.count(), " ms");
  }
}

bool InProcessStore::check(std::span<const std::string> keys, Milliseconds) {
  for (const std::string& k : keys) check_key(concat("store check ", wire::quote_key(k)), k);
  std::lock_guard lock(impl_->mu);
  for (const std::string& k : keys)
    if (!impl_->data.contains(k)) return false;
  return true;
}

bool InProcessStore::erase(std::string_view key, Milliseconds) {
  check_key(concat("store erase ", wire::quote_key(key)), key);
  std::lock_guard lock(impl_->mu);
  return impl_->data.erase(std::string(key)) != 0;
}

}  // namespace tpcomm
