// SPDX-License-Identifier: Apache-2.0
// What the C API's functions share (src/api/capi*.cpp): the handles behind the opaque pointers,
// the registry of live handles, and the conversions and checks at the boundary, where every
// exception becomes a status and a message.
#pragma once

#include <exception>
#include <memory>
#include <new>
#include <string>

#include "core/check.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"
#include "tpcomm/status.hpp"
#include "tpcomm/tensor.hpp"
#include "tpcomm/tpcomm.h"

struct tpcomm_bootstrap_s {
  tpcomm::Bootstrap boot;
  std::string last_error;
};

struct tpcomm_group_s {
  // Shared by the handles of one group: a group of `tpcomm_parallel_groups_create` that is laid
  // out like TP is TP's, and every handle keeps the `ParallelGroups` they came from alive.
  std::shared_ptr<tpcomm::Group> group;
  std::string last_error;
};

struct tpcomm_capture_s {
  tpcomm_group_s* owner;
  tpcomm::Group::CaptureScope scope;
};

namespace tpcomm::capi {

/// The message of the last failure on this thread (`tpcomm_last_error`).
inline thread_local std::string t_last_error;

/// What an opaque handle points at. Handles are typed so that one of another kind (a bootstrap
/// passed as a group) is refused rather than read as the wrong struct.
enum class HandleKind { kBootstrap, kGroup, kCapture };

/// The C type's name of a kind ("tpcomm_group").
const char* to_string(HandleKind kind) noexcept;

/// Registers a new handle of `kind` as alive.
void add_handle(const void* h, HandleKind kind);
/// Forgets a live handle of `kind`: nullptr, or (nothing forgotten) why not, as `unusable`.
const char* remove_handle(const void* h, HandleKind kind);

/// Whether `h` is a live handle of any kind.
bool is_alive(const void* h);

/// Null, not alive or of another kind than `kind`: the message's end after the argument's name
/// ("group"); nullptr when usable. Valid until the next call on this thread.
const char* unusable(const void* h, HandleKind kind);

/// Records a failure on this thread and, when given, on the handle.
tpcomm_status fail(Status s, std::string message, std::string* handle_error = nullptr);

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

/// Checks a bootstrap's rank, world size and locality (-1, -1: not given) as the C API takes
/// them; throws kInvalidArgument naming the bad one.
void check_ranks(int rank, int world_size, int local_rank, int local_world_size);

/// The view of a C tensor; throws kInvalidArgument naming `what` for a bad one.
TensorView view_of(const tpcomm_tensor* t, const char* what);
/// The view of an optional C tensor (an empty view for NULL).
TensorView optional_view(const tpcomm_tensor* t, const char* what);
Fp8Scales fp8_of(const tpcomm_tensor* scale, const tpcomm_tensor* row_scales,
                 const tpcomm_tensor* group_scales);
/// The routed experts' outputs, the token map, the weights and the shared experts' output
/// (NULL: none) of an MoE combine.
MoeCombine moe_of(const tpcomm_tensor* experts, const tpcomm_tensor* map,
                  const tpcomm_tensor* weights, const tpcomm_tensor* shared);
NormWeight weight_of(int weight);
ReduceOp reduce_op_of(int op);
/// The store key of a user's `key`, in the bootstrap's namespace.
std::string key_of(const tpcomm_bootstrap_s* b, const char* key);
/// `timeout_ms` (at most `Options::kMaxTimeoutMs`), or the bootstrap's when it is <= 0.
Milliseconds timeout_of(const tpcomm_bootstrap_s* b, std::int64_t timeout_ms);
inline Stream stream_of(void* stream) { return static_cast<Stream>(stream); }

/// A group call: checks the handle, runs `call` (returning Status) and records a failure with
/// the group's message.
template <class Call>
tpcomm_status group_call(const char* fn, tpcomm_group_s* g, Call&& call) noexcept {
  if (const char* why = unusable(g, HandleKind::kGroup))
    return fail(Status::kInvalidArgument, detail::concat(fn, ": group", why));
  bool threw = true;
  const tpcomm_status s = guarded(fn, &g->last_error, [&] {
    const Status r = call(*g->group);
    threw = false;
    return r;
  });
  if (s != TPCOMM_OK && !threw) {
    // A status returned by the group (not thrown): its message is the group's.
    return fail(static_cast<Status>(s), detail::concat(fn, ": ", g->group->last_error()),
                &g->last_error);
  }
  return s;
}

}  // namespace tpcomm::capi
