// SPDX-License-Identifier: Apache-2.0
// A bootstrap over the application's own store, given as C callbacks (`tpcomm_store_ops`).
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "api/capi_support.hpp"
#include "bootstrap/deadline.hpp"
#include "bootstrap/heartbeat.hpp"
#include "core/check.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/store.hpp"
#include "tpcomm/tpcomm.h"

namespace tpcomm::capi {
namespace {

/// What the callback that just ran said of its failure (`tpcomm_store_callback_error`); read and
/// cleared after every callback, on the thread that called it.
thread_local std::string t_callback_error;

/// `Store` over `tpcomm_store_ops`: each operation one callback (a wait, a get per key).
class CallbackStore final : public Store {
 public:
  explicit CallbackStore(const tpcomm_store_ops& ops) : ops_(ops) {}

  void set(std::string_view key, std::span<const std::byte> value, Milliseconds timeout) override {
    const std::string k(key);
    expect_ok("set", k, timeout,
              ops_.set(ops_.ctx, k.c_str(), value.data(), value.size(), ms(timeout)));
  }

  Bytes get(std::string_view key, Milliseconds timeout) override {
    const std::string k(key);
    Bytes value(256);
    std::size_t size = 0;
    expect_ok("get", k, timeout,
              ops_.get(ops_.ctx, k.c_str(), value.data(), value.size(), &size, ms(timeout)));
    if (size > value.size()) {  // it is set now: take it whole
      value.resize(size);
      expect_ok("get", k, timeout,
                ops_.get(ops_.ctx, k.c_str(), value.data(), value.size(), &size, ms(timeout)));
      TPCOMM_CHECK(size <= value.size(), Status::kProtocolError, "store get of key '", k,
                   "': the application's store changed the value's size between two calls");
    }
    value.resize(size);
    return value;
  }

  std::int64_t add(std::string_view key, std::int64_t delta, Milliseconds timeout) override {
    const std::string k(key);
    std::int64_t result = 0;
    expect_ok("add", k, timeout, ops_.add(ops_.ctx, k.c_str(), delta, &result, ms(timeout)));
    return result;
  }

  void wait(std::span<const std::string> keys, Milliseconds timeout) override {
    const Deadline deadline = deadline_after(timeout);
    for (const std::string& k : keys) {
      std::size_t size = 0;
      expect_ok("wait", k, timeout,
                ops_.get(ops_.ctx, k.c_str(), nullptr, 0, &size, ms(remaining(deadline))));
    }
  }

  bool check(std::span<const std::string> keys, Milliseconds timeout) override {
    for (const std::string& k : keys) {
      int exists = 0;
      expect_ok("check", k, timeout, ops_.check(ops_.ctx, k.c_str(), &exists, ms(timeout)));
      if (exists == 0) return false;
    }
    return true;
  }

  bool erase(std::string_view key, Milliseconds timeout) override {
    const std::string k(key);
    int existed = 0;
    expect_ok("erase", k, timeout, ops_.erase(ops_.ctx, k.c_str(), &existed, ms(timeout)));
    return existed != 0;
  }

 private:
  static std::int64_t ms(Milliseconds t) { return std::max<std::int64_t>(t.count(), 0); }

  /// Throws for a callback's failure: kTimeout naming the key for TPCOMM_TIMEOUT, the status it
  /// gave (or kInternal for one that is not a tpcomm_status) otherwise.
  /// The callback's own text, when it gave one, follows.
  static void expect_ok(const char* op, const std::string& key, Milliseconds timeout, int status) {
    const std::string said = std::exchange(t_callback_error, std::string());
    if (status == TPCOMM_OK) return;
    if (status == TPCOMM_TIMEOUT && said.empty())
      TPCOMM_THROW(Status::kTimeout, "store ", op, " of key '", key, "': not set within ",
                   timeout.count(), " ms (the application's store)");
    if (status == TPCOMM_TIMEOUT)
      TPCOMM_THROW(Status::kTimeout, "store ", op, " of key '", key, "': ", said,
                   " (the application's store)");
    const bool known = status > TPCOMM_OK && status <= TPCOMM_MISMATCH;
    TPCOMM_THROW(known ? static_cast<Status>(status) : Status::kInternal, "store ", op, " of key '",
                 key, "': the application's store failed (status ", status, ")",
                 said.empty() ? "" : ": ", said);
  }

  tpcomm_store_ops ops_;
};

}  // namespace
}  // namespace tpcomm::capi

void tpcomm_store_callback_error(const char* message) {
  try {
    tpcomm::capi::t_callback_error = message != nullptr ? message : "";
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory, the status alone is reported
  }
}

tpcomm_status tpcomm_bootstrap_from_store(const tpcomm_store_ops* ops, int rank, int world_size,
                                          int local_rank, int local_world_size, int64_t timeout_ms,
                                          tpcomm_bootstrap* out) {
  return tpcomm::capi::guarded("tpcomm_bootstrap_from_store", nullptr, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    TPCOMM_C_REQUIRE(ops != nullptr && ops->set != nullptr && ops->get != nullptr &&
                         ops->add != nullptr && ops->check != nullptr && ops->erase != nullptr,
                     "ops is NULL or lacks a callback");
    tpcomm::capi::check_ranks(rank, world_size, local_rank, local_world_size);
    const tpcomm::Options options = tpcomm::Options::from_env();
    std::shared_ptr<tpcomm::Store> store = std::make_shared<tpcomm::capi::CallbackStore>(*ops);
    const std::int64_t t =
        timeout_ms > 0 ? std::min(timeout_ms, tpcomm::Options::kMaxTimeoutMs) : options.timeout_ms;
    store->set_default_timeout(tpcomm::Milliseconds(t));
    // No connection of tpcomm's tells that a peer is gone: heartbeats do (NOTE [heartbeat watch]).
    if (options.rank_watch && world_size > 1) {
      store = tpcomm::with_heartbeat(std::move(store), rank, world_size,
                                     tpcomm::Milliseconds(options.heartbeat_timeout_ms));
    }
    *out = new tpcomm_bootstrap_s{
        tpcomm::Bootstrap(std::move(store), rank, world_size, local_rank, local_world_size), {}};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kBootstrap);
    return tpcomm::Status::kOk;
  });
}
