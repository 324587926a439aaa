// SPDX-License-Identifier: Apache-2.0
// The C API's shared conversions and checks (src/api/capi_support.hpp).
#include "api/capi_support.hpp"

#include <algorithm>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>

#include "tpcomm/options.hpp"

namespace tpcomm::capi {

static_assert(TPCOMM_INTERNAL == static_cast<int>(Status::kInternal));
static_assert(TPCOMM_MISMATCH == static_cast<int>(Status::kMismatch));
static_assert(TPCOMM_FAILURE_CALLBACK == static_cast<int>(FailureMode::kCallback));
static_assert(TPCOMM_FAILURE_TEARDOWN == static_cast<int>(FailureMode::kTeardown));
static_assert(TPCOMM_F8E5M2 == static_cast<int>(DType::kF8E5M2));
static_assert(TPCOMM_AVG == static_cast<int>(ReduceOp::kAvg));
static_assert(TPCOMM_MAX_DIMS == TensorView::kMaxDims);

namespace {

/// The bootstrap, group and capture handles alive now, with their kinds. A call on a handle that
/// was destroyed (or never made) is refused with kInvalidArgument instead of reading freed
/// memory, until the address is reused by a new handle (tpcomm.h says so); so is a handle of
/// another kind.
class Handles {
 public:
  void add(const void* h, HandleKind kind) {
    std::lock_guard lock(mu_);
    live_[h] = kind;
  }
  /// The kind of a live `h`; nullopt when it is not alive.
  std::optional<HandleKind> kind(const void* h) {
    std::lock_guard lock(mu_);
    const auto it = live_.find(h);
    if (it == live_.end()) return std::nullopt;
    return it->second;
  }
  /// False when `h` was not alive as a `kind`.
  bool remove(const void* h, HandleKind kind) {
    std::lock_guard lock(mu_);
    const auto it = live_.find(h);
    if (it == live_.end() || it->second != kind) return false;
    live_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  std::unordered_map<const void*, HandleKind> live_;
};

Handles& handles() {
  static Handles* h = new Handles;  // never destroyed: handles may outlive static destruction
  return *h;
}

thread_local std::string t_why;

}  // namespace

const char* to_string(HandleKind kind) noexcept {
  switch (kind) {
    case HandleKind::kBootstrap:
      return "tpcomm_bootstrap";
    case HandleKind::kGroup:
      return "tpcomm_group";
    case HandleKind::kCapture:
      return "tpcomm_capture";
  }
  return "handle";
}

void add_handle(const void* h, HandleKind kind) { handles().add(h, kind); }

bool is_alive(const void* h) { return handles().kind(h).has_value(); }

const char* remove_handle(const void* h, HandleKind kind) {
  if (handles().remove(h, kind)) return nullptr;
  if (h == nullptr || !is_alive(h)) return " was destroyed already (or never created)";
  return unusable(h, kind);  // alive, of another kind
}

const char* unusable(const void* h, HandleKind kind) {
  if (h == nullptr) return " is NULL";
  const std::optional<HandleKind> actual = handles().kind(h);
  if (!actual) return " was destroyed (or never created)";
  if (*actual != kind) {
    try {
      t_why = detail::concat(" is a ", to_string(*actual), ", not a ", to_string(kind));
      return t_why.c_str();
    } catch (const std::bad_alloc&) {
      return " is a handle of another kind";
    }
  }
  return nullptr;
}

tpcomm_status fail(Status s, std::string message, std::string* handle_error) {
  if (handle_error != nullptr) *handle_error = message;
  t_last_error = std::move(message);
  return static_cast<tpcomm_status>(s);
}

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

void check_ranks(int rank, int world_size, int local_rank, int local_world_size) {
  TPCOMM_C_REQUIRE(world_size >= 1, "world_size is ", world_size);
  TPCOMM_C_REQUIRE(rank >= 0 && rank < world_size, "rank ", rank, " is outside 0..",
                   world_size - 1);
  TPCOMM_C_REQUIRE((local_rank == -1) == (local_world_size == -1),
                   "local_rank and local_world_size must both be given or both be -1");
  TPCOMM_C_REQUIRE(local_world_size == -1 || (local_rank >= 0 && local_rank < local_world_size),
                   "local_rank ", local_rank, " is outside 0..", local_world_size - 1);
}

TensorView optional_view(const tpcomm_tensor* t, const char* what) {
  return t == nullptr ? TensorView{} : view_of(t, what);
}

Fp8Scales fp8_of(const tpcomm_tensor* scale, const tpcomm_tensor* row_scales,
                 const tpcomm_tensor* group_scales) {
  return {optional_view(scale, "fp8_scale"), optional_view(row_scales, "fp8_row_scales"),
          optional_view(group_scales, "fp8_group_scales")};
}

MoeCombine moe_of(const tpcomm_tensor* experts, const tpcomm_tensor* map,
                  const tpcomm_tensor* weights, const tpcomm_tensor* shared) {
  return {view_of(experts, "experts"), view_of(map, "map"), view_of(weights, "weights"),
          optional_view(shared, "shared")};
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

Milliseconds timeout_of(const tpcomm_bootstrap_s* b, std::int64_t timeout_ms) {
  if (timeout_ms <= 0) return b->boot.timeout();
  return Milliseconds{std::min(timeout_ms, Options::kMaxTimeoutMs)};
}

}  // namespace tpcomm::capi
