// SPDX-License-Identifier: Apache-2.0
// The C API (include/tpcomm/tpcomm.h): handles around the C++ objects, argument checks, and
// every exception caught at the boundary and turned into a status and a message.
#include "tpcomm/tpcomm.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "api/info.hpp"
#include "core/check.hpp"
#include "ops/fused_norm.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/norm.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"

struct tpcomm_bootstrap_s {
  tpcomm::Bootstrap boot;
  std::string last_error;
};

struct tpcomm_group_s {
  tpcomm::Group group;
  std::string last_error;
};

struct tpcomm_capture_s {
  tpcomm_group_s* owner;
  tpcomm::Group::CaptureScope scope;
};

namespace tpcomm {
namespace {

static_assert(TPCOMM_INTERNAL == static_cast<int>(Status::kInternal));
static_assert(TPCOMM_MISMATCH == static_cast<int>(Status::kMismatch));
static_assert(TPCOMM_FAILURE_CALLBACK == static_cast<int>(FailureMode::kCallback));
static_assert(TPCOMM_FAILURE_TEARDOWN == static_cast<int>(FailureMode::kTeardown));
static_assert(TPCOMM_F8E5M2 == static_cast<int>(DType::kF8E5M2));
static_assert(TPCOMM_AVG == static_cast<int>(ReduceOp::kAvg));
static_assert(TPCOMM_MAX_DIMS == TensorView::kMaxDims);

thread_local std::string t_last_error;

/// The bootstrap, group and capture handles alive now. A call on a handle that was destroyed
/// (or never made) is refused with kInvalidArgument instead of reading freed memory, until the
/// address is reused by a new handle (tpcomm.h says so).
class Handles {
 public:
  void add(const void* h) {
    std::lock_guard lock(mu_);
    live_.insert(h);
  }
  /// False when `h` was not alive.
  bool remove(const void* h) {
    std::lock_guard lock(mu_);
    return live_.erase(h) == 1;
  }
  bool alive(const void* h) {
    std::lock_guard lock(mu_);
    return live_.count(h) == 1;
  }

 private:
  std::mutex mu_;
  std::unordered_set<const void*> live_;
};

Handles& handles() {
  static Handles* h = new Handles;  // never destroyed: handles may outlive static destruction
  return *h;
}

/// Null or not alive: the message for `what` ("boot", "group").
const char* unusable(const void* h) {
  if (h == nullptr) return " is NULL";
  if (!handles().alive(h)) return " was destroyed (or never created)";
  return nullptr;
}

/// Records a failure on this thread and, when given, on the handle.
tpcomm_status fail(Status s, std::string message, std::string* handle_error = nullptr) {
  if (handle_error != nullptr) *handle_error = message;
  t_last_error = std::move(message);
  return static_cast<tpcomm_status>(s);
}

/// Runs `body` (returning Status), turning every exception into a status and a message that
/// starts with `fn`.
template <class Body>
tpcomm_status guarded(const char* fn, std::string* handle_error, Body&& body) noexcept {
  try {
    return static_cast<tpcomm_status>(body());
  } catch (const Error& e) {
    return fail(e.status(), detail::concat(fn, ": ", e.what()), handle_error);
  } catch (const std::bad_alloc&) {
    return fail(Status::kSystemError, detail::concat(fn, ": out of host memory"), handle_error);
  } catch (const std::exception& e) {
    return fail(Status::kInternal, detail::concat(fn, ": ", e.what()), handle_error);
  } catch (...) {
    return fail(Status::kInternal, detail::concat(fn, ": unknown exception"), handle_error);
  }
}

#define TPCOMM_C_REQUIRE(cond, ...) \
  TPCOMM_CHECK(cond, ::tpcomm::Status::kInvalidArgument, __VA_ARGS__)

/// The view of a C tensor; throws kInvalidArgument naming `what` for a bad one.
TensorView view_of(const tpcomm_tensor* t, const char* what) {
  TPCOMM_C_REQUIRE(t != nullptr, what, " is NULL");
  TPCOMM_C_REQUIRE(t->dtype >= 0 && t->dtype <= TPCOMM_F8E5M2, what, ": dtype ", t->dtype,
                   " is not a tpcomm_dtype (0..", int{TPCOMM_F8E5M2}, ")");
  TPCOMM_C_REQUIRE(t->ndim >= 0 && t->ndim <= TPCOMM_MAX_DIMS, what, ": ndim ", t->ndim,
                   " is outside 0..", TPCOMM_MAX_DIMS);
  TensorView v;
  v.data = t->data;
  v.dtype = static_cast<DType>(t->dtype);
  v.ndim = t->ndim;
  v.device = t->device;
  std::int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    TPCOMM_C_REQUIRE(t->shape[i] >= 0, what, ": shape[", d, "] is ", t->shape[i]);
    v.shape[i] = t->shape[i];
    v.strides[i] = stride;
    TPCOMM_C_REQUIRE(!__builtin_mul_overflow(stride, t->shape[i], &stride) &&
                         stride <= std::numeric_limits<std::int64_t>::max() / 8,
                     what, ": the shape's element count overflows");
  }
  TPCOMM_C_REQUIRE(v.numel() == 0 || t->data != nullptr, what, ": data is NULL for ", v.numel(),
                   " elements");
  return v;
}

/// The view of an optional C tensor (an empty view for NULL).
TensorView optional_view(const tpcomm_tensor* t, const char* what) {
  return t == nullptr ? TensorView{} : view_of(t, what);
}

Fp8Scales fp8_of(const tpcomm_tensor* scale, const tpcomm_tensor* row_scales,
                 const tpcomm_tensor* group_scales) {
  return {optional_view(scale, "fp8_scale"), optional_view(row_scales, "fp8_row_scales"),
          optional_view(group_scales, "fp8_group_scales")};
}

NormWeight weight_of(int weight) {
  TPCOMM_C_REQUIRE(weight == TPCOMM_WEIGHT_GAMMA || weight == TPCOMM_WEIGHT_ONE_PLUS_GAMMA,
                   "weight ", weight, " is not a tpcomm_norm_weight (0 or 1)");
  return static_cast<NormWeight>(weight);
}

ReduceOp reduce_op_of(int op) {
  TPCOMM_C_REQUIRE(op >= 0 && op <= TPCOMM_AVG, "op ", op, " is not a tpcomm_reduce_op (0..",
                   int{TPCOMM_AVG}, ")");
  return static_cast<ReduceOp>(op);
}

std::string key_of(const tpcomm_bootstrap_s* b, const char* key) {
  TPCOMM_C_REQUIRE(key != nullptr && *key != '\0', "key is NULL or empty");
  return detail::concat(b->boot.prefix(), "/user/", key);
}

/// `timeout_ms` (at most `Options::kMaxTimeoutMs`), or the bootstrap's when it is <= 0.
Milliseconds timeout_of(const tpcomm_bootstrap_s* b, std::int64_t timeout_ms) {
  if (timeout_ms <= 0) return b->boot.timeout();
  return Milliseconds{std::min(timeout_ms, Options::kMaxTimeoutMs)};
}

Stream stream_of(void* stream) { return static_cast<Stream>(stream); }

/// A group call: checks the handle, runs `call` (returning Status) and records a failure with
/// the group's message.
template <class Call>
tpcomm_status group_call(const char* fn, tpcomm_group_s* g, Call&& call) noexcept {
  if (const char* why = unusable(g))
    return fail(Status::kInvalidArgument, detail::concat(fn, ": group", why));
  bool threw = true;
  const tpcomm_status s = guarded(fn, &g->last_error, [&] {
    const Status r = call(g->group);
    threw = false;
    return r;
  });
  if (s != TPCOMM_OK && !threw) {
    // A status returned by the group (not thrown): its message is the group's.
    return fail(static_cast<Status>(s), detail::concat(fn, ": ", g->group.last_error()),
                &g->last_error);
  }
  return s;
}

}  // namespace
}  // namespace tpcomm

using tpcomm::fail;
using tpcomm::guarded;
using tpcomm::Status;
using tpcomm::TensorView;

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

const char* tpcomm_last_error(void) { return tpcomm::t_last_error.c_str(); }

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
    tpcomm::handles().add(*out);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_create(int rank, int world_size, int local_rank,
                                      int local_world_size, const char* store_host, int store_port,
                                      tpcomm_bootstrap* out) {
  return guarded("tpcomm_bootstrap_create", nullptr, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    TPCOMM_C_REQUIRE(world_size >= 1, "world_size is ", world_size);
    TPCOMM_C_REQUIRE(rank >= 0 && rank < world_size, "rank ", rank, " is outside 0..",
                     world_size - 1);
    TPCOMM_C_REQUIRE((local_rank == -1) == (local_world_size == -1),
                     "local_rank and local_world_size must both be given or both be -1");
    TPCOMM_C_REQUIRE(local_world_size == -1 || (local_rank >= 0 && local_rank < local_world_size),
                     "local_rank ", local_rank, " is outside 0..", local_world_size - 1);
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
    tpcomm::handles().add(*out);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_destroy(tpcomm_bootstrap boot) {
  return guarded("tpcomm_bootstrap_destroy", nullptr, [&] {
    if (boot == nullptr) return Status::kOk;
    TPCOMM_C_REQUIRE(tpcomm::handles().remove(boot),
                     "boot was destroyed already (or never created)");
    delete boot;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_rank_info(tpcomm_bootstrap boot, tpcomm_rank_info* out) {
  return guarded("tpcomm_bootstrap_rank_info", nullptr, [&] {
    if (const char* why = tpcomm::unusable(boot)) TPCOMM_C_REQUIRE(false, "boot", why);
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = {boot->boot.rank(),       boot->boot.world_size(),
            boot->boot.local_rank(), boot->boot.local_world_size(),
            boot->boot.node_id(),    -1};
    return Status::kOk;
  });
}

tpcomm_status tpcomm_bootstrap_barrier(tpcomm_bootstrap boot) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_bootstrap_barrier: boot", why));
  return guarded("tpcomm_bootstrap_barrier", &boot->last_error, [&] {
    boot->boot.barrier();
    return Status::kOk;
  });
}

const char* tpcomm_bootstrap_last_error(tpcomm_bootstrap boot) {
  return tpcomm::unusable(boot) != nullptr ? "" : boot->last_error.c_str();
}

tpcomm_status tpcomm_store_set(tpcomm_bootstrap boot, const char* key, const void* value,
                               size_t size, int64_t timeout_ms) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_store_set: boot", why));
  return guarded("tpcomm_store_set", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(value != nullptr || size == 0, "value is NULL with a size of ", size);
    const std::string k = tpcomm::key_of(boot, key);
    boot->boot.store().set(k, std::span(static_cast<const std::byte*>(value), size),
                           tpcomm::timeout_of(boot, timeout_ms));
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_get(tpcomm_bootstrap boot, const char* key, void* buf, size_t capacity,
                               size_t* size, int64_t timeout_ms) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_store_get: boot", why));
  return guarded("tpcomm_store_get", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(size != nullptr, "size is NULL");
    TPCOMM_C_REQUIRE(buf != nullptr || capacity == 0, "buf is NULL with a capacity of ", capacity);
    const std::string k = tpcomm::key_of(boot, key);
    const tpcomm::Bytes value = boot->boot.store().get(k, tpcomm::timeout_of(boot, timeout_ms));
    *size = value.size();
    TPCOMM_C_REQUIRE(value.size() <= capacity, "the value of \"", key, "\" has ", value.size(),
                     " bytes, the buffer ", capacity);
    if (!value.empty()) std::memcpy(buf, value.data(), value.size());
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_add(tpcomm_bootstrap boot, const char* key, int64_t delta,
                               int64_t* result, int64_t timeout_ms) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_store_add: boot", why));
  return guarded("tpcomm_store_add", &boot->last_error, [&] {
    const std::string k = tpcomm::key_of(boot, key);
    const std::int64_t v = boot->boot.store().add(k, delta, tpcomm::timeout_of(boot, timeout_ms));
    if (result != nullptr) *result = v;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_check(tpcomm_bootstrap boot, const char* key, int* exists,
                                 int64_t timeout_ms) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_store_check: boot", why));
  return guarded("tpcomm_store_check", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(exists != nullptr, "exists is NULL");
    const std::string keys[1] = {tpcomm::key_of(boot, key)};
    *exists = boot->boot.store().check(keys, tpcomm::timeout_of(boot, timeout_ms)) ? 1 : 0;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_store_erase(tpcomm_bootstrap boot, const char* key, int* existed,
                                 int64_t timeout_ms) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_store_erase: boot", why));
  return guarded("tpcomm_store_erase", &boot->last_error, [&] {
    const std::string k = tpcomm::key_of(boot, key);
    const bool was = boot->boot.store().erase(k, tpcomm::timeout_of(boot, timeout_ms));
    if (existed != nullptr) *existed = was ? 1 : 0;
    return Status::kOk;
  });
}

// ---- groups -----------------------------------------------------------------------------------

tpcomm_status tpcomm_group_create(tpcomm_bootstrap boot, int device,
                                  const tpcomm_group_config* config, tpcomm_group* out) {
  if (const char* why = tpcomm::unusable(boot))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        tpcomm::detail::concat("tpcomm_group_create: boot", why));
  return guarded("tpcomm_group_create", &boot->last_error, [&] {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    TPCOMM_C_REQUIRE(device >= 0, "device ", device, " is negative");
    tpcomm::GroupConfig c;
    if (config != nullptr) {
      c.custom_all_reduce = config->custom_all_reduce != 0;
      c.nccl = config->nccl != 0;
      c.fusion = config->fusion != 0;
      TPCOMM_C_REQUIRE(config->fusion_max_tokens >= 0 && config->fusion_hidden >= 0,
                       "config: fusion_max_tokens ", config->fusion_max_tokens,
                       " and fusion_hidden ", config->fusion_hidden,
                       " must be >= 0 (0: the default)");
      if (config->fusion_max_tokens > 0) c.fusion_max_tokens = config->fusion_max_tokens;
      c.fusion_hidden = config->fusion_hidden;
    }
    *out =
        new tpcomm_group_s{tpcomm::Group(boot->boot, device, tpcomm::Options::from_env(), c), {}};
    tpcomm::handles().add(*out);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_destroy(tpcomm_group group) {
  return guarded("tpcomm_group_destroy", nullptr, [&] {
    if (group == nullptr) return Status::kOk;
    TPCOMM_C_REQUIRE(tpcomm::handles().remove(group),
                     "group was destroyed already (or never created)");
    delete group;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_rank_info(tpcomm_group group, tpcomm_rank_info* out) {
  return tpcomm::group_call("tpcomm_group_rank_info", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = {g.rank(), g.world_size(), -1, -1, -1, g.device()};
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_health(tpcomm_group group) {
  return tpcomm::group_call("tpcomm_group_health", group,
                            [&](tpcomm::Group& g) { return g.health(); });
}

tpcomm_status tpcomm_group_abort(tpcomm_group group) {
  return tpcomm::group_call("tpcomm_group_abort", group, [&](tpcomm::Group& g) {
    g.abort();
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_set_failure_mode(tpcomm_group group, int mode, tpcomm_failure_fn fn,
                                            void* user) {
  return tpcomm::group_call("tpcomm_group_set_failure_mode", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(mode >= TPCOMM_FAILURE_RAISE && mode <= TPCOMM_FAILURE_CALLBACK, "mode ", mode,
                     " is not a tpcomm_failure_mode");
    tpcomm::Group::FailureHandler handler;
    if (fn != nullptr)
      handler = [fn, user](Status s, const std::string& message) {
        fn(static_cast<int>(s), message.c_str(), user);
      };
    g.set_failure_mode(static_cast<tpcomm::FailureMode>(mode), std::move(handler));
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_tune(tpcomm_group group) {
  return tpcomm::group_call("tpcomm_group_tune", group, [&](tpcomm::Group& g) {
    g.tune();
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_warm_up(tpcomm_group group, void* stream) {
  return tpcomm::group_call("tpcomm_group_warm_up", group,
                            [&](tpcomm::Group& g) { return g.warm_up(tpcomm::stream_of(stream)); });
}

const char* tpcomm_group_last_error(tpcomm_group group) {
  return tpcomm::unusable(group) != nullptr ? "" : group->last_error.c_str();
}

tpcomm_status tpcomm_group_backend_for(tpcomm_group group, int op, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, int capturing, char* buf,
                                       size_t capacity) {
  return tpcomm::group_call("tpcomm_group_backend_for", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(buf != nullptr && capacity > 0, "buf is NULL or capacity is 0");
    const TensorView i = tpcomm::view_of(in, "in");
    const TensorView o = tpcomm::view_of(out, "out");
    std::string name;
    switch (op) {
      case TPCOMM_OP_ALL_REDUCE:
        name = g.backend_for_all_reduce(i, o, capturing != 0);
        break;
      case TPCOMM_OP_ALL_REDUCE_ADD_RMSNORM:
        name = g.backend_for_add_rmsnorm(i, o, capturing != 0);
        break;
      case TPCOMM_OP_ALL_GATHER:
        name = g.backend_for_all_gather(i, o);
        break;
      case TPCOMM_OP_ALL_TO_ALL:
        name = g.backend_for_all_to_all(i, o);
        break;
      default:
        TPCOMM_THROW(Status::kInvalidArgument, "op ", op, " is not a tpcomm_op");
    }
    const std::size_t n = std::min(name.size(), capacity - 1);
    std::memcpy(buf, name.data(), n);
    buf[n] = '\0';
    return Status::kOk;
  });
}

// ---- collectives ------------------------------------------------------------------------------
// The hot path: on success nothing is allocated or recorded.

tpcomm_status tpcomm_all_reduce(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, int op, void* stream) {
  return tpcomm::group_call("tpcomm_all_reduce", group, [&](tpcomm::Group& g) {
    return g.all_reduce(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"),
                        tpcomm::stream_of(stream), tpcomm::reduce_op_of(op));
  });
}

tpcomm_status tpcomm_all_gather(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream) {
  return tpcomm::group_call("tpcomm_all_gather", group, [&](tpcomm::Group& g) {
    return g.all_gather(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"),
                        tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_reduce_scatter(tpcomm_group group, const tpcomm_tensor* in,
                                    const tpcomm_tensor* out, int op, void* stream) {
  return tpcomm::group_call("tpcomm_reduce_scatter", group, [&](tpcomm::Group& g) {
    return g.reduce_scatter(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"),
                            tpcomm::stream_of(stream), tpcomm::reduce_op_of(op));
  });
}

tpcomm_status tpcomm_all_to_all(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream) {
  return tpcomm::group_call("tpcomm_all_to_all", group, [&](tpcomm::Group& g) {
    return g.all_to_all(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"),
                        tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_all_to_all_counts(tpcomm_group group, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, const int64_t* counts,
                                       size_t num_counts, void* stream) {
  return tpcomm::group_call("tpcomm_all_to_all_counts", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(counts != nullptr, "counts is NULL");
    const auto w = static_cast<std::size_t>(g.world_size());
    TPCOMM_C_REQUIRE(num_counts == w * w, "num_counts is ", num_counts,
                     ", not world size^2 = ", w * w);
    return g.all_to_all(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"),
                        std::span<const std::int64_t>(counts, num_counts),
                        tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_broadcast(tpcomm_group group, const tpcomm_tensor* in,
                               const tpcomm_tensor* out, int root, void* stream) {
  return tpcomm::group_call("tpcomm_broadcast", group, [&](tpcomm::Group& g) {
    return g.broadcast(tpcomm::view_of(in, "in"), tpcomm::view_of(out, "out"), root,
                       tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_send(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream) {
  return tpcomm::group_call("tpcomm_send", group, [&](tpcomm::Group& g) {
    return g.send(tpcomm::view_of(buf, "buf"), peer, tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_recv(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream) {
  return tpcomm::group_call("tpcomm_recv", group, [&](tpcomm::Group& g) {
    return g.recv(tpcomm::view_of(buf, "buf"), peer, tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_all_reduce_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* x, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream) {
  return tpcomm::group_call("tpcomm_all_reduce_add_rmsnorm", group, [&](tpcomm::Group& g) {
    return g.all_reduce_add_rmsnorm(
        tpcomm::view_of(x, "x"), tpcomm::optional_view(residual, "residual"),
        tpcomm::view_of(gamma, "gamma"), eps, tpcomm::view_of(norm_out, "norm_out"),
        tpcomm::view_of(residual_out, "residual_out"), tpcomm::stream_of(stream),
        tpcomm::fp8_of(fp8_scale, fp8_row_scales, fp8_group_scales), tpcomm::weight_of(weight));
  });
}

tpcomm_status tpcomm_add_rmsnorm(const tpcomm_tensor* x, const tpcomm_tensor* residual,
                                 const tpcomm_tensor* gamma, float eps,
                                 const tpcomm_tensor* norm_out, const tpcomm_tensor* residual_out,
                                 const tpcomm_tensor* fp8_scale,
                                 const tpcomm_tensor* fp8_row_scales,
                                 const tpcomm_tensor* fp8_group_scales, int weight, void* stream) {
  return guarded("tpcomm_add_rmsnorm", nullptr, [&] {
    const tpcomm::TensorView xv = tpcomm::view_of(x, "x"),
                             rv = tpcomm::optional_view(residual, "residual"),
                             gv = tpcomm::view_of(gamma, "gamma"),
                             nv = tpcomm::view_of(norm_out, "norm_out"),
                             ov = tpcomm::view_of(residual_out, "residual_out");
    const tpcomm::Fp8Scales fp8 = tpcomm::fp8_of(fp8_scale, fp8_row_scales, fp8_group_scales);
    const tpcomm::NormWeight w = tpcomm::weight_of(weight);
    // The checks again, for their message (add_rmsnorm only logs it).
    tpcomm::AddRmsNormCall call;
    std::string message;
    if (const Status s = tpcomm::check_add_rmsnorm(xv, rv, gv, eps, nv, ov, fp8, w,
                                                   "tpcomm_add_rmsnorm", &call, &message);
        s != Status::kOk) {
      tpcomm::fail(s, message);
      return s;
    }
    const Status s =
        tpcomm::add_rmsnorm(xv, rv, gv, eps, nv, ov, tpcomm::stream_of(stream), fp8, w);
    if (s != Status::kOk) {
      tpcomm::fail(s, tpcomm::detail::concat("tpcomm_add_rmsnorm: ", tpcomm::to_string(s),
                                             ": the kernel could not be launched on the stream"));
    }
    return s;
  });
}

tpcomm_status tpcomm_lm_head_exchange(tpcomm_group group, const tpcomm_tensor* shard_logits,
                                      const tpcomm_tensor* out, int64_t equal_rows,
                                      const int64_t* rows_per_rank, size_t num_ranks,
                                      void* stream) {
  return tpcomm::group_call("tpcomm_lm_head_exchange", group, [&](tpcomm::Group& g) {
    tpcomm::LmHeadLayout layout;
    if (rows_per_rank == nullptr) {
      TPCOMM_C_REQUIRE(equal_rows >= 0, "equal_rows is ", equal_rows, " and rows_per_rank is NULL");
      layout = tpcomm::LmHeadLayout::equal(equal_rows);
    } else {
      TPCOMM_C_REQUIRE(num_ranks == static_cast<std::size_t>(g.world_size()), "num_ranks is ",
                       num_ranks, ", not the world size ", g.world_size());
      layout = tpcomm::LmHeadLayout::counts(std::span(rows_per_rank, num_ranks));
    }
    return g.lm_head_exchange(tpcomm::view_of(shard_logits, "shard_logits"),
                              tpcomm::view_of(out, "out"), layout, tpcomm::stream_of(stream));
  });
}

tpcomm_status tpcomm_prepare_exchange(tpcomm_group group, int64_t bytes_per_peer, void* stream) {
  return tpcomm::group_call("tpcomm_prepare_exchange", group, [&](tpcomm::Group& g) {
    g.prepare_exchange(bytes_per_peer > 0 ? bytes_per_peer : std::int64_t{4} << 20,
                       tpcomm::stream_of(stream));
    return Status::kOk;
  });
}

// ---- capture ----------------------------------------------------------------------------------

tpcomm_status tpcomm_capture_begin(tpcomm_group group, void* stream, tpcomm_capture* out) {
  return tpcomm::group_call("tpcomm_capture_begin", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    *out = new tpcomm_capture_s{group, g.capture(tpcomm::stream_of(stream))};
    tpcomm::handles().add(*out);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_capture_end(tpcomm_capture scope) {
  if (scope == nullptr) return TPCOMM_OK;
  if (!tpcomm::handles().remove(scope))
    return tpcomm::fail(tpcomm::Status::kInvalidArgument,
                        "tpcomm_capture_end: scope was ended already (or never begun)");
  const std::unique_ptr<tpcomm_capture_s> owned(scope);
  return tpcomm::group_call("tpcomm_capture_end", owned->owner,
                            [&](tpcomm::Group&) { return owned->scope.close(); });
}

}  // extern "C"
