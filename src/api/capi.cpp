// SPDX-License-Identifier: Apache-2.0
// The C API (include/tpcomm/tpcomm.h): the library's version, status names and report, the
// bootstrap and its store. Groups, collectives and capture scopes are in capi_group.cpp; what
// they share in capi_support.hpp.
#include "tpcomm/tpcomm.h"

#include <cstring>
#include <span>
#include <string>

#include "api/capi_support.hpp"
#include "api/info.hpp"
#include "tpcomm/options.hpp"

using tpcomm::Status;
using tpcomm::TensorView;
using tpcomm::capi::fail;
using tpcomm::capi::guarded;

extern "C" {

tpcomm_status tpcomm_version(const char** version, int* number) {
  if (version != nullptr) *version = TPCOMM_VERSION;
  if (number != nullptr) {
    // TPCOMM_VERSION is "MAJOR.MINOR.PATCH".
    int parts[3] = {0, 0, 0};
    int i = 0;
    for (const char* c = TPCOMM_VERSION; *c != '\0' && i < 3; ++c) {
      if (*c == '.') {
        ++i;
      } else {
        parts[i] = parts[i] * 10 + (*c - '0');
      }
    }
    *number = parts[0] * 10000 + parts[1] * 100 + parts[2];
  }
  return TPCOMM_OK;
}

const char* tpcomm_status_string(int status) {
  if (status < 0 || status > TPCOMM_MISMATCH) return "unknown";
  // Every name of `to_string(Status)` is a literal.
  return tpcomm::to_string(static_cast<Status>(status)).data();
}

const char* tpcomm_last_error(void) { return tpcomm::capi::t_last_error.c_str(); }

tpcomm_status tpcomm_info(int as_json, char* buf, size_t capacity, size_t* needed,
                          int* invalid_knobs) {
  return guarded("tpcomm_info", nullptr, [&] {
    int invalid = 0;
    const std::string report = tpcomm::info_report(as_json != 0, &invalid);
    if (needed != nullptr) *needed = report.size() + 1;
    if (invalid_knobs != nullptr) *invalid_knobs = invalid;
    if (buf == nullptr && capacity == 0) return Status::kOk;
    TPCOMM_C_REQUIRE(buf != nullptr, "buf is NULL with a capacity of ", capacity);
    TPCOMM_C_REQUIRE(capacity > report.size(), "the report needs ", report.size() + 1,
                     " bytes, the buffer has ", capacity);
    std::memcpy(buf, report.c_str(), report.size() + 1);
    return Status::kOk;
  });
}

// ---- bootstrap and store ----------------------------------------------------------------------

tpcomm_status tpcomm_bootstrap_from_env(tpcomm_bootstrap* out) {
  return guarded("tpcomm_bootstrap_from_env", nullptr, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    *out = new tpcomm_bootstrap_s{tpcomm::Bootstrap::from_env(), {}};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kBootstrap);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_create(int rank, int world_size, int local_rank,
                                      int local_world_size, const char* store_host, int store_port,
                                      tpcomm_bootstrap* out) {
  return guarded("tpcomm_bootstrap_create", nullptr, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    tpcomm::capi::check_ranks(rank, world_size, local_rank, local_world_size);
    TPCOMM_C_REQUIRE(world_size == 1 || (store_host != nullptr && *store_host != '\0'),
                     "store_host is NULL or empty");
    TPCOMM_C_REQUIRE(world_size == 1 || (store_port >= 1 && store_port <= 65535), "store_port ",
                     store_port, " is outside 1..65535");
    tpcomm::LaunchInfo info;
    info.rank = rank;
    info.world_size = world_size;
    info.local_rank = local_rank;
    info.local_world_size = local_world_size;
    if (store_host != nullptr) info.store_host = store_host;
    info.store_port = store_port;
    info.source = "explicit";
    *out = new tpcomm_bootstrap_s{
        tpcomm::Bootstrap::from_launch_info(info, tpcomm::Options::from_env()), {}};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kBootstrap);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_split(tpcomm_bootstrap boot, const int* ranks, size_t num_ranks,
                                     const char* tag, tpcomm_bootstrap* out) {
  return guarded("tpcomm_bootstrap_split", nullptr, [&] {
    if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
      TPCOMM_C_REQUIRE(false, "boot", why);
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    TPCOMM_C_REQUIRE(ranks != nullptr && num_ranks > 0, "ranks is NULL or empty");
    TPCOMM_C_REQUIRE(tag != nullptr, "tag is NULL");
    *out = new tpcomm_bootstrap_s{boot->boot.split(std::span(ranks, num_ranks), tag), {}};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kBootstrap);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_destroy(tpcomm_bootstrap boot) {
  return guarded("tpcomm_bootstrap_destroy", nullptr, [&] {
    if (boot == nullptr) return Status::kOk;
    if (const char* why = tpcomm::capi::remove_handle(boot, tpcomm::capi::HandleKind::kBootstrap))
      TPCOMM_C_REQUIRE(false, "boot", why);
    delete boot;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_rank_info(tpcomm_bootstrap boot, tpcomm_rank_info* out) {
  return guarded("tpcomm_bootstrap_rank_info", nullptr, [&] {
    if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
      TPCOMM_C_REQUIRE(false, "boot", why);
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = {boot->boot.rank(),       boot->boot.world_size(),
            boot->boot.local_rank(), boot->boot.local_world_size(),
            boot->boot.node_id(),    -1};
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_barrier(tpcomm_bootstrap boot) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_bootstrap_barrier: boot", why));
  return guarded("tpcomm_bootstrap_barrier", &boot->last_error, [&] {
    boot->boot.barrier();
    return Status::kOk;
  });
}

const char* tpcomm_bootstrap_last_error(tpcomm_bootstrap boot) {
  return tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap) != nullptr
             ? ""
             : boot->last_error.c_str();
}

tpcomm_status tpcomm_store_set(tpcomm_bootstrap boot, const char* key, const void* value,
                               size_t size, int64_t timeout_ms) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_store_set: boot", why));
  return guarded("tpcomm_store_set", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(value != nullptr || size == 0, "value is NULL with a size of ", size);
    const std::string k = tpcomm::capi::key_of(boot, key);
    boot->boot.store().set(k, std::span(static_cast<const std::byte*>(value), size),
                           tpcomm::capi::timeout_of(boot, timeout_ms));
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_get(tpcomm_bootstrap boot, const char* key, void* buf, size_t capacity,
                               size_t* size, int64_t timeout_ms) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_store_get: boot", why));
  return guarded("tpcomm_store_get", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(size != nullptr, "size is NULL");
    TPCOMM_C_REQUIRE(buf != nullptr || capacity == 0, "buf is NULL with a capacity of ", capacity);
    const std::string k = tpcomm::capi::key_of(boot, key);
    const tpcomm::Bytes value =
        boot->boot.store().get(k, tpcomm::capi::timeout_of(boot, timeout_ms));
    *size = value.size();
    TPCOMM_C_REQUIRE(value.size() <= capacity, "the value of \"", key, "\" has ", value.size(),
                     " bytes, the buffer ", capacity);
    if (!value.empty()) std::memcpy(buf, value.data(), value.size());
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_add(tpcomm_bootstrap boot, const char* key, int64_t delta,
                               int64_t* result, int64_t timeout_ms) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_store_add: boot", why));
  return guarded("tpcomm_store_add", &boot->last_error, [&] {
    const std::string k = tpcomm::capi::key_of(boot, key);
    const std::int64_t v =
        boot->boot.store().add(k, delta, tpcomm::capi::timeout_of(boot, timeout_ms));
    if (result != nullptr) *result = v;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_check(tpcomm_bootstrap boot, const char* key, int* exists,
                                 int64_t timeout_ms) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_store_check: boot", why));
  return guarded("tpcomm_store_check", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(exists != nullptr, "exists is NULL");
    const std::string keys[1] = {tpcomm::capi::key_of(boot, key)};
    *exists = boot->boot.store().check(keys, tpcomm::capi::timeout_of(boot, timeout_ms)) ? 1 : 0;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_erase(tpcomm_bootstrap boot, const char* key, int* existed,
                                 int64_t timeout_ms) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::detail::concat("tpcomm_store_erase: boot", why));
  return guarded("tpcomm_store_erase", &boot->last_error, [&] {
    const std::string k = tpcomm::capi::key_of(boot, key);
    const bool was = boot->boot.store().erase(k, tpcomm::capi::timeout_of(boot, timeout_ms));
    if (existed != nullptr) *existed = was ? 1 : 0;
    return Status::kOk;
  });
}

}  // extern "C"
