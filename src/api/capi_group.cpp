// SPDX-License-Identifier: Apache-2.0
// The C API's groups, collectives and capture scopes (include/tpcomm/tpcomm.h).
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "api/capi_support.hpp"
#include "backends/op.hpp"
#include "kernels/launch_error.hpp"
#include "ops/fused_norm.hpp"
#include "ops/moe.hpp"
#include "tpcomm/tpcomm.h"

using tpcomm::Status;
using tpcomm::TensorView;
using tpcomm::capi::fail;
using tpcomm::capi::guarded;

namespace {

/// `tpcomm_determinism`'s values other than the default, and what they set.
constexpr std::pair<int, tpcomm::Determinism> kDeterminism[] = {
    {TPCOMM_DETERMINISM_OFF, tpcomm::Determinism::kOff},
    {TPCOMM_DETERMINISM_ON, tpcomm::Determinism::kOn},
    {TPCOMM_DETERMINISM_STRICT, tpcomm::Determinism::kStrict},
};

}  // namespace

extern "C" {

// ---- groups -----------------------------------------------------------------------------------

tpcomm_status tpcomm_group_create(tpcomm_bootstrap boot, int device,
                                  const tpcomm_group_config* config, tpcomm_group* out) {
  if (const char* why = tpcomm::capi::unusable(boot, tpcomm::capi::HandleKind::kBootstrap))
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
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
      TPCOMM_C_REQUIRE(config->deterministic >= TPCOMM_DETERMINISM_DEFAULT &&
                           config->deterministic <= TPCOMM_DETERMINISM_STRICT,
                       "config: deterministic ", config->deterministic,
                       " is not a tpcomm_determinism (0 to 3)");
      for (const auto& [value, d] : kDeterminism)
        if (config->deterministic == value) c.deterministic = d;
      TPCOMM_C_REQUIRE(config->fusion_max_tokens >= 0 && config->fusion_hidden >= 0,
                       "config: fusion_max_tokens ", config->fusion_max_tokens,
                       " and fusion_hidden ", config->fusion_hidden,
                       " must be >= 0 (0: the default)");
      if (config->fusion_max_tokens > 0) c.fusion_max_tokens = config->fusion_max_tokens;
      c.fusion_hidden = config->fusion_hidden;
    }
    *out = new tpcomm_group_s{
        std::make_shared<tpcomm::Group>(boot->boot, device, tpcomm::Options::from_env(), c), {}};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kGroup);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_destroy(tpcomm_group group) {
  return guarded("tpcomm_group_destroy", nullptr, [&] {
    if (group == nullptr) return Status::kOk;
    if (const char* why = tpcomm::capi::remove_handle(group, tpcomm::capi::HandleKind::kGroup))
      TPCOMM_C_REQUIRE(false, "group", why);
    delete group;
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_rank_info(tpcomm_group group, tpcomm_rank_info* out) {
  return tpcomm::capi::group_call("tpcomm_group_rank_info", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = {g.rank(), g.world_size(), -1, -1, -1, g.device()};
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_health(tpcomm_group group) {
  return tpcomm::capi::group_call("tpcomm_group_health", group,
                                  [&](tpcomm::Group& g) { return g.health(); });
}

tpcomm_status tpcomm_group_abort(tpcomm_group group) {
  return tpcomm::capi::group_call("tpcomm_group_abort", group, [&](tpcomm::Group& g) {
    g.abort();
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_set_failure_mode(tpcomm_group group, int mode, tpcomm_failure_fn fn,
                                            void* user) {
  return tpcomm::capi::group_call("tpcomm_group_set_failure_mode", group, [&](tpcomm::Group& g) {
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
  return tpcomm::capi::group_call("tpcomm_group_tune", group, [&](tpcomm::Group& g) {
    g.tune();
    return Status::kOk;
  });
}

tpcomm_status tpcomm_group_warm_up(tpcomm_group group, void* stream) {
  return tpcomm::capi::group_call("tpcomm_group_warm_up", group, [&](tpcomm::Group& g) {
    return g.warm_up(tpcomm::capi::stream_of(stream));
  });
}

const char* tpcomm_group_last_error(tpcomm_group group) {
  return tpcomm::capi::unusable(group, tpcomm::capi::HandleKind::kGroup) != nullptr
             ? ""
             : group->last_error.c_str();
}

// NOTE [the operation table] (backends/op.hpp): the C values are the table's.
static_assert(tpcomm::row(tpcomm::Op::kAllReduce).c_code == TPCOMM_OP_ALL_REDUCE);
static_assert(tpcomm::row(tpcomm::Op::kAllReduceAddRmsNorm).c_code ==
              TPCOMM_OP_ALL_REDUCE_ADD_RMSNORM);
static_assert(tpcomm::row(tpcomm::Op::kAllGather).c_code == TPCOMM_OP_ALL_GATHER);
static_assert(tpcomm::row(tpcomm::Op::kAllToAll).c_code == TPCOMM_OP_ALL_TO_ALL);
static_assert(tpcomm::row(tpcomm::Op::kMoeFinalize).c_code == TPCOMM_OP_MOE_FINALIZE);
static_assert(tpcomm::row(tpcomm::Op::kReduceScatterAddRmsNorm).c_code ==
              TPCOMM_OP_REDUCE_SCATTER_ADD_RMSNORM);

tpcomm_status tpcomm_group_backend_for(tpcomm_group group, int op, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, int capturing, char* buf,
                                       size_t capacity) {
  return tpcomm::capi::group_call("tpcomm_group_backend_for", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(buf != nullptr && capacity > 0, "buf is NULL or capacity is 0");
    const TensorView i = tpcomm::capi::view_of(in, "in");
    const TensorView o = tpcomm::capi::view_of(out, "out");
    std::string name;
    switch (op) {
      case TPCOMM_OP_ALL_REDUCE:
        name = g.backend_for_all_reduce(i, o, capturing != 0);
        break;
      case TPCOMM_OP_ALL_REDUCE_ADD_RMSNORM:
        name = g.backend_for_add_rmsnorm(i, o, capturing != 0);
        break;
      case TPCOMM_OP_MOE_FINALIZE:
        name = g.backend_for_moe_finalize(i, o, capturing != 0);
        break;
      case TPCOMM_OP_REDUCE_SCATTER_ADD_RMSNORM:
        name = g.backend_for_reduce_scatter_add_rmsnorm(i, o, capturing != 0);
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
  return tpcomm::capi::group_call("tpcomm_all_reduce", group, [&](tpcomm::Group& g) {
    return g.all_reduce(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"),
                        tpcomm::capi::stream_of(stream), tpcomm::capi::reduce_op_of(op));
  });
}

tpcomm_status tpcomm_all_gather(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream) {
  return tpcomm::capi::group_call("tpcomm_all_gather", group, [&](tpcomm::Group& g) {
    return g.all_gather(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"),
                        tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_gather(tpcomm_group group, const tpcomm_tensor* in, const tpcomm_tensor* out,
                            int root, void* stream) {
  return tpcomm::capi::group_call("tpcomm_gather", group, [&](tpcomm::Group& g) {
    return g.gather(tpcomm::capi::view_of(in, "in"), tpcomm::capi::optional_view(out, "out"), root,
                    tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_reduce_scatter(tpcomm_group group, const tpcomm_tensor* in,
                                    const tpcomm_tensor* out, int op, void* stream) {
  return tpcomm::capi::group_call("tpcomm_reduce_scatter", group, [&](tpcomm::Group& g) {
    return g.reduce_scatter(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"),
                            tpcomm::capi::stream_of(stream), tpcomm::capi::reduce_op_of(op));
  });
}

tpcomm_status tpcomm_all_to_all(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream) {
  return tpcomm::capi::group_call("tpcomm_all_to_all", group, [&](tpcomm::Group& g) {
    return g.all_to_all(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"),
                        tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_all_to_all_counts(tpcomm_group group, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, const int64_t* counts,
                                       size_t num_counts, void* stream) {
  return tpcomm::capi::group_call("tpcomm_all_to_all_counts", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(counts != nullptr, "counts is NULL");
    const auto w = static_cast<std::size_t>(g.world_size());
    TPCOMM_C_REQUIRE(num_counts == w * w, "num_counts is ", num_counts,
                     ", not world size^2 = ", w * w);
    return g.all_to_all(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"),
                        std::span<const std::int64_t>(counts, num_counts),
                        tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_broadcast(tpcomm_group group, const tpcomm_tensor* in,
                               const tpcomm_tensor* out, int root, void* stream) {
  return tpcomm::capi::group_call("tpcomm_broadcast", group, [&](tpcomm::Group& g) {
    return g.broadcast(tpcomm::capi::view_of(in, "in"), tpcomm::capi::view_of(out, "out"), root,
                       tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_send(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream) {
  return tpcomm::capi::group_call("tpcomm_send", group, [&](tpcomm::Group& g) {
    return g.send(tpcomm::capi::view_of(buf, "buf"), peer, tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_recv(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream) {
  return tpcomm::capi::group_call("tpcomm_recv", group, [&](tpcomm::Group& g) {
    return g.recv(tpcomm::capi::view_of(buf, "buf"), peer, tpcomm::capi::stream_of(stream));
  });
}

namespace {

/// `Group::all_reduce_add_rmsnorm` and its sequence-parallel form: one signature.
using FusedNorm = Status (tpcomm::Group::*)(const TensorView&, const TensorView&, const TensorView&,
                                            float, const TensorView&, const TensorView&,
                                            tpcomm::Stream, const tpcomm::Fp8Scales&,
                                            tpcomm::NormWeight) noexcept;

/// The C entry point `name` of the fused norm `method`, its arguments converted and checked.
tpcomm_status fused_norm(const char* name, FusedNorm method, tpcomm_group group,
                         const tpcomm_tensor* x, const tpcomm_tensor* residual,
                         const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
                         const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
                         const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales,
                         int weight, void* stream) {
  return tpcomm::capi::group_call(name, group, [&](tpcomm::Group& g) {
    return (g.*method)(
        tpcomm::capi::view_of(x, "x"), tpcomm::capi::optional_view(residual, "residual"),
        tpcomm::capi::view_of(gamma, "gamma"), eps, tpcomm::capi::view_of(norm_out, "norm_out"),
        tpcomm::capi::view_of(residual_out, "residual_out"), tpcomm::capi::stream_of(stream),
        tpcomm::capi::fp8_of(fp8_scale, fp8_row_scales, fp8_group_scales),
        tpcomm::capi::weight_of(weight));
  });
}

}  // namespace

tpcomm_status tpcomm_all_reduce_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* x, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream) {
  return fused_norm("tpcomm_all_reduce_add_rmsnorm", &tpcomm::Group::all_reduce_add_rmsnorm, group,
                    x, residual, gamma, eps, norm_out, residual_out, fp8_scale, fp8_row_scales,
                    fp8_group_scales, weight, stream);
}

tpcomm_status tpcomm_reduce_scatter_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* x, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream) {
  return fused_norm("tpcomm_reduce_scatter_add_rmsnorm", &tpcomm::Group::reduce_scatter_add_rmsnorm,
                    group, x, residual, gamma, eps, norm_out, residual_out, fp8_scale,
                    fp8_row_scales, fp8_group_scales, weight, stream);
}

tpcomm_status tpcomm_add_rmsnorm(const tpcomm_tensor* x, const tpcomm_tensor* residual,
                                 const tpcomm_tensor* gamma, float eps,
                                 const tpcomm_tensor* norm_out, const tpcomm_tensor* residual_out,
                                 const tpcomm_tensor* fp8_scale,
                                 const tpcomm_tensor* fp8_row_scales,
                                 const tpcomm_tensor* fp8_group_scales, int weight, void* stream) {
  return guarded("tpcomm_add_rmsnorm", nullptr, [&] {
    const tpcomm::TensorView xv = tpcomm::capi::view_of(x, "x"),
                             rv = tpcomm::capi::optional_view(residual, "residual"),
                             gv = tpcomm::capi::view_of(gamma, "gamma"),
                             nv = tpcomm::capi::view_of(norm_out, "norm_out"),
                             ov = tpcomm::capi::view_of(residual_out, "residual_out");
    const tpcomm::Fp8Scales fp8 = tpcomm::capi::fp8_of(fp8_scale, fp8_row_scales, fp8_group_scales);
    const tpcomm::NormWeight w = tpcomm::capi::weight_of(weight);
    // The checks again, for their message (add_rmsnorm only logs it).
    tpcomm::AddRmsNormCall call;
    std::string message;
    if (const Status s = tpcomm::check_add_rmsnorm(xv, rv, gv, eps, nv, ov, fp8, w,
                                                   "tpcomm_add_rmsnorm", &call, &message);
        s != Status::kOk) {
      tpcomm::capi::fail(s, message);
      return s;
    }
    const Status s =
        tpcomm::add_rmsnorm(xv, rv, gv, eps, nv, ov, tpcomm::capi::stream_of(stream), fp8, w);
    if (s != Status::kOk) {
      tpcomm::capi::fail(
          s, tpcomm::detail::concat("tpcomm_add_rmsnorm: ", tpcomm::to_string(s),
                                    ": the kernel could not be launched on the stream: ",
                                    tpcomm::kernels::last_launch_error()));
    }
    return s;
  });
}

tpcomm_status tpcomm_moe_finalize_all_reduce_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* experts, const tpcomm_tensor* map,
    const tpcomm_tensor* weights, const tpcomm_tensor* shared, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream) {
  return tpcomm::capi::group_call(
      "tpcomm_moe_finalize_all_reduce_add_rmsnorm", group, [&](tpcomm::Group& g) {
        return g.moe_finalize_all_reduce_add_rmsnorm(
            tpcomm::capi::moe_of(experts, map, weights, shared),
            tpcomm::capi::optional_view(residual, "residual"),
            tpcomm::capi::view_of(gamma, "gamma"), eps, tpcomm::capi::view_of(norm_out, "norm_out"),
            tpcomm::capi::view_of(residual_out, "residual_out"), tpcomm::capi::stream_of(stream),
            tpcomm::capi::fp8_of(fp8_scale, fp8_row_scales, fp8_group_scales),
            tpcomm::capi::weight_of(weight));
      });
}

tpcomm_status tpcomm_moe_combine(const tpcomm_tensor* experts, const tpcomm_tensor* map,
                                 const tpcomm_tensor* weights, const tpcomm_tensor* shared,
                                 const tpcomm_tensor* out, void* stream) {
  return guarded("tpcomm_moe_combine", nullptr, [&] {
    const tpcomm::MoeCombine moe = tpcomm::capi::moe_of(experts, map, weights, shared);
    const tpcomm::TensorView ov = tpcomm::capi::view_of(out, "out");
    // The checks again, for their message (moe_combine only logs it).
    tpcomm::kernels::MoeCombineParams params{};
    std::string message;
    if (const Status s =
            tpcomm::check_moe_combine(moe, ov, "tpcomm_moe_combine", &params, &message);
        s != Status::kOk) {
      tpcomm::capi::fail(s, message);
      return s;
    }
    const Status s = tpcomm::moe_combine(moe, ov, tpcomm::capi::stream_of(stream));
    if (s != Status::kOk)
      tpcomm::capi::fail(s, tpcomm::detail::concat("tpcomm_moe_combine: ", tpcomm::to_string(s),
                                                   ": the kernel could not be launched: ",
                                                   tpcomm::kernels::last_launch_error()));
    return s;
  });
}

tpcomm_status tpcomm_lm_head_exchange(tpcomm_group group, const tpcomm_tensor* shard_logits,
                                      const tpcomm_tensor* out, int64_t equal_rows,
                                      const int64_t* rows_per_rank, size_t num_ranks,
                                      void* stream) {
  return tpcomm::capi::group_call("tpcomm_lm_head_exchange", group, [&](tpcomm::Group& g) {
    tpcomm::LmHeadLayout layout;
    if (rows_per_rank == nullptr) {
      TPCOMM_C_REQUIRE(equal_rows >= 0, "equal_rows is ", equal_rows, " and rows_per_rank is NULL");
      layout = tpcomm::LmHeadLayout::equal(equal_rows);
    } else {
      TPCOMM_C_REQUIRE(num_ranks == static_cast<std::size_t>(g.world_size()), "num_ranks is ",
                       num_ranks, ", not the world size ", g.world_size());
      layout = tpcomm::LmHeadLayout::counts(std::span(rows_per_rank, num_ranks));
    }
    return g.lm_head_exchange(tpcomm::capi::view_of(shard_logits, "shard_logits"),
                              tpcomm::capi::view_of(out, "out"), layout,
                              tpcomm::capi::stream_of(stream));
  });
}

tpcomm_status tpcomm_prepare_exchange(tpcomm_group group, int64_t bytes_per_peer, void* stream) {
  return tpcomm::capi::group_call("tpcomm_prepare_exchange", group, [&](tpcomm::Group& g) {
    g.prepare_exchange(bytes_per_peer > 0 ? bytes_per_peer : std::int64_t{4} << 20,
                       tpcomm::capi::stream_of(stream));
    return Status::kOk;
  });
}

// ---- capture ----------------------------------------------------------------------------------

tpcomm_status tpcomm_capture_begin(tpcomm_group group, void* stream, tpcomm_capture* out) {
  return tpcomm::capi::group_call("tpcomm_capture_begin", group, [&](tpcomm::Group& g) {
    TPCOMM_C_REQUIRE(out != nullptr, "out is NULL");
    *out = nullptr;
    *out = new tpcomm_capture_s{group, g.capture(tpcomm::capi::stream_of(stream))};
    tpcomm::capi::add_handle(*out, tpcomm::capi::HandleKind::kCapture);
    return Status::kOk;
  });
}

tpcomm_status tpcomm_capture_end(tpcomm_capture scope) {
  if (scope == nullptr) return TPCOMM_OK;
  if (const char* why = tpcomm::capi::remove_handle(scope, tpcomm::capi::HandleKind::kCapture)) {
    return tpcomm::capi::fail(tpcomm::Status::kInvalidArgument,
                              tpcomm::capi::is_alive(scope)
                                  ? tpcomm::detail::concat("tpcomm_capture_end: scope", why)
                                  : "tpcomm_capture_end: scope was ended already (or never begun)");
  }
  const std::unique_ptr<tpcomm_capture_s> owned(scope);
  return tpcomm::capi::group_call("tpcomm_capture_end", owned->owner,
                                  [&](tpcomm::Group&) { return owned->scope.close(); });
}

}  // extern "C"
