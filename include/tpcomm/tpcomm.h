/* SPDX-License-Identifier: Apache-2.0 */
/* The C API of tpcomm: a thin layer over the C++ one (tpcomm/tpcomm.hpp) for C programs and for
 * languages that load libtpcomm.so through a foreign-function interface (Python's ctypes).
 *
 * Conventions:
 * - Every function returns a `tpcomm_status` (TPCOMM_OK is 0) and writes results through
 *   pointers; nothing throws, nothing exits.
 * - After a failure, `tpcomm_last_error()` (this thread's last failure, for every call) and, for
 *   calls on a handle, `tpcomm_bootstrap_last_error` / `tpcomm_group_last_error` (that handle's
 *   last failure) say what went wrong. The strings stay valid until the next call that fails on
 *   the same thread or handle.
 * - Handles are opaque; each `*_create`/`*_from_*` pairs with one `*_destroy`
 *   (`tpcomm_capture_begin` with one `tpcomm_capture_end`). A call on a handle that was
 *   destroyed already, or was never made, returns TPCOMM_INVALID_ARGUMENT ("was destroyed") as
 *   long as no new handle took its address; so does a handle of another kind (a bootstrap
 *   passed as a group: "is a tpcomm_bootstrap, not a tpcomm_group"), which is left untouched;
 *   destroying NULL does nothing. As with `ncclCommDestroy`, destroying a handle while another
 *   thread still uses it is the caller's error.
 * - Streams are `cudaStream_t` passed as `void*` (NULL: the legacy default stream).
 * - The rules of `tpcomm::Group` hold: every rank makes the same collective calls in the same
 *   order with the same sizes; one thread per rank; a TPCOMM_TIMEOUT, TPCOMM_ABORTED or
 *   TPCOMM_NCCL_ERROR leaves the group unusable (build a new one).
 */
#ifndef TPCOMM_TPCOMM_H
#define TPCOMM_TPCOMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; `tpcomm_version` gives the library's. */
#define TPCOMM_VERSION_MAJOR 0
#define TPCOMM_VERSION_MINOR 1
#define TPCOMM_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, as `tpcomm_version` reports it. */
#define TPCOMM_VERSION_NUMBER \
  (TPCOMM_VERSION_MAJOR * 10000 + TPCOMM_VERSION_MINOR * 100 + TPCOMM_VERSION_PATCH)

/* The same codes and meanings as `tpcomm::Status`. */
typedef enum tpcomm_status {
  TPCOMM_OK = 0,
  TPCOMM_UNSUPPORTED = 1,      /* no backend can serve the request */
  TPCOMM_INVALID_ARGUMENT = 2, /* nothing was done; the handle stays usable */
  TPCOMM_CUDA_ERROR = 3,
  TPCOMM_NCCL_ERROR = 4,
  TPCOMM_TIMEOUT = 5, /* a peer did not arrive within TPCOMM_TIMEOUT_MS */
  TPCOMM_ABORTED = 6,
  TPCOMM_UNAVAILABLE = 7, /* no driver, no NCCL, no peer access */
  TPCOMM_SYSTEM_ERROR = 8,
  TPCOMM_PROTOCOL_ERROR = 9,
  TPCOMM_INTERNAL = 10,
  TPCOMM_MISMATCH = 11 /* the ranks called different collectives; the group is unusable */
} tpcomm_status;

/* Element types: the numbering of `tpcomm::DType`. */
typedef enum tpcomm_dtype {
  TPCOMM_F32 = 0,
  TPCOMM_F16 = 1,
  TPCOMM_BF16 = 2,
  TPCOMM_F64 = 3,
  TPCOMM_I8 = 4,
  TPCOMM_U8 = 5,
  TPCOMM_I32 = 6,
  TPCOMM_U32 = 7,
  TPCOMM_I64 = 8,
  TPCOMM_U64 = 9,
  TPCOMM_F8E4M3 = 10,
  TPCOMM_F8E5M2 = 11
} tpcomm_dtype;

/* Reduction operators: the numbering of `tpcomm::ReduceOp`. */
typedef enum tpcomm_reduce_op {
  TPCOMM_SUM = 0,
  TPCOMM_PROD = 1,
  TPCOMM_MAX = 2,
  TPCOMM_MIN = 3,
  TPCOMM_AVG = 4
} tpcomm_reduce_op;

/* What multiplies the normalised row: the numbering of `tpcomm::NormWeight`. */
typedef enum tpcomm_norm_weight {
  TPCOMM_WEIGHT_GAMMA = 0,         /* gamma */
  TPCOMM_WEIGHT_ONE_PLUS_GAMMA = 1 /* 1 + gamma (Gemma's RMSNorm) */
} tpcomm_norm_weight;

#define TPCOMM_MAX_DIMS 6

/* A contiguous (row-major) tensor in device memory: `ndim` extents in `shape` (0 dims: one
 * element). `dtype` is a `tpcomm_dtype`; `device` the CUDA ordinal (-1: unknown). */
typedef struct tpcomm_tensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  int32_t device;
  int32_t reserved; /* 0 */
  int64_t shape[TPCOMM_MAX_DIMS];
} tpcomm_tensor;

/* A rank's place in a bootstrap or group. */
typedef struct tpcomm_rank_info {
  int32_t rank;
  int32_t world_size;
  int32_t local_rank;
  int32_t local_world_size;
  int32_t node_id; /* -1 for a group */
  int32_t device;  /* -1 for a bootstrap */
} tpcomm_rank_info;

/* Whether a group's all-reduces and fused norms are batch-invariant (`tpcomm::Determinism`,
 * docs/DETERMINISM.md): the numbering of `tpcomm_group_config::deterministic`. */
typedef enum tpcomm_determinism {
  TPCOMM_DETERMINISM_DEFAULT = 0, /* TPCOMM_DETERMINISTIC decides */
  TPCOMM_DETERMINISM_OFF = 1,
  TPCOMM_DETERMINISM_ON = 2,    /* custom kernels wherever they can serve; others logged once */
  TPCOMM_DETERMINISM_STRICT = 3 /* as ON; a call they cannot serve: TPCOMM_INVALID_ARGUMENT */
} tpcomm_determinism;

/* What a group may build (`tpcomm::GroupConfig`): the first three 0 or 1; `deterministic` a
 * `tpcomm_determinism` (0: TPCOMM_DETERMINISTIC); the fused operation's largest batch,
 * `fusion_max_tokens` rows of `fusion_hidden` elements, sizes its workspace (0:
 * TPCOMM_FUSION_MAX_TOKENS and TPCOMM_FUSION_HIDDEN). Every rank passes the same values. */
typedef struct tpcomm_group_config {
  int32_t custom_all_reduce;
  int32_t nccl;
  int32_t fusion;
  int32_t deterministic;
  int64_t fusion_max_tokens;
  int64_t fusion_hidden;
} tpcomm_group_config;

typedef struct tpcomm_bootstrap_s* tpcomm_bootstrap;
typedef struct tpcomm_group_s* tpcomm_group;
typedef struct tpcomm_capture_s* tpcomm_capture;

/* ---- library ------------------------------------------------------------------------------ */

/* "0.1.0" and TPCOMM_VERSION_NUMBER of the library that is loaded; either may be NULL. */
tpcomm_status tpcomm_version(const char** version, int* number);
/* A short stable name ("ok", "timeout", ...); "unknown" for a code outside the enum. Never NULL. */
const char* tpcomm_status_string(int status);
/* This thread's last failure ("" when none). Never NULL. */
const char* tpcomm_last_error(void);
/* `tpcomm info` (as_json 0: text, 1: JSON) into `buf` of `capacity` bytes, NUL-terminated.
 * `needed` (optional) receives the report's size including the NUL; with `buf` NULL and
 * `capacity` 0 only the size is returned. TPCOMM_INVALID_ARGUMENT when it does not fit (`buf`
 * then holds nothing). `invalid_knobs` (optional): the number of TPCOMM_* variables that could
 * not be parsed (each listed in the report). The machine is probed at every call. */
tpcomm_status tpcomm_info(int as_json, char* buf, size_t capacity, size_t* needed,
                          int* invalid_knobs);

/* ---- bootstrap and store ------------------------------------------------------------------ */

/* From the launch environment (torchrun, mpirun, srun, `tpcomm launch`, TPCOMM_*), as
 * `tpcomm::Bootstrap::from_env`. Collective over the job's ranks. */
tpcomm_status tpcomm_bootstrap_from_env(tpcomm_bootstrap* out);
/* From explicit values, as `tpcomm::Bootstrap::from_launch_info`: rank 0 hosts the TCP store on
 * `store_host`:`store_port` (1..65535), the others connect to it. `local_rank` and
 * `local_world_size` may be -1 (then derived from host names). Knobs (timeout, token, bind
 * address) come from the TPCOMM_* variables. Collective. */
tpcomm_status tpcomm_bootstrap_create(int rank, int world_size, int local_rank,
                                      int local_world_size, const char* store_host, int store_port,
                                      tpcomm_bootstrap* out);
/* A store of the application's own (an engine's `torch.distributed` store, say), as callbacks.
 * Each returns TPCOMM_OK, TPCOMM_TIMEOUT when a wait ran out, or another tpcomm_status for any
 * other failure; `timeout_ms` bounds the call. `get` waits up to `timeout_ms` for `key`, sets
 * `*size` to its value's size and copies the value into `buf` when it fits `capacity` (else it
 * copies nothing: tpcomm calls again with a large enough buffer); `add` adds `delta` to the
 * 64-bit counter at `key` (created as 0) and sets `*result` to the new value; `check` sets
 * `*exists`; `erase` removes `key` and sets `*existed`. They are called from the thread that
 * calls tpcomm, and from the threads of the groups built on the bootstrap (a failure's
 * report); a store shared by several processes must make a key set by one visible to all. */
typedef struct tpcomm_store_ops {
  void* ctx; /* passed to every callback */
  int (*set)(void* ctx, const char* key, const void* value, size_t size, int64_t timeout_ms);
  int (*get)(void* ctx, const char* key, void* buf, size_t capacity, size_t* size,
             int64_t timeout_ms);
  int (*add)(void* ctx, const char* key, int64_t delta, int64_t* result, int64_t timeout_ms);
  int (*check)(void* ctx, const char* key, int* exists, int64_t timeout_ms);
  int (*erase)(void* ctx, const char* key, int* existed, int64_t timeout_ms);
} tpcomm_store_ops;

/* Called from within a `tpcomm_store_ops` callback that is about to return a failure: `message`
 * (copied; NULL clears it) is what went wrong, in the application's words (an exception's text,
 * "get('k') did not return within 3000 ms"), and follows the library's own message for that
 * failure. This thread only; a callback that returns TPCOMM_OK discards it. */
void tpcomm_store_callback_error(const char* message);

/* A bootstrap over the application's store `ops` (copied; `ops->ctx` and what it points at must
 * outlive every bootstrap and group made from it): no store of tpcomm's own, no port. Keys go
 * under "tpcomm/". `local_rank` and `local_world_size` as for `tpcomm_bootstrap_create` (-1:
 * from host names, a collective). `timeout_ms` bounds every wait (<= 0: TPCOMM_TIMEOUT_MS).
 * Without tpcomm's own store there is no rank watch: a dead peer is noticed at the group's
 * deadline (docs/RELIABILITY.md). */
tpcomm_status tpcomm_bootstrap_from_store(const tpcomm_store_ops* ops, int rank, int world_size,
                                          int local_rank, int local_world_size, int64_t timeout_ms,
                                          tpcomm_bootstrap* out);
/* A bootstrap for the sub-group `ranks` (`num_ranks` ranks of `boot`, strictly ascending,
 * containing this rank), as `tpcomm::Bootstrap::split`: it shares `boot`'s store (no second
 * port; groups for tensor, attention and expert parallelism come from one job bootstrap) in a key
 * namespace of its own named by `tag` (non-empty, no '/', the same on every member). Its rank is
 * this rank's index in `ranks`. Local: no communication. `boot` may be destroyed before it. */
tpcomm_status tpcomm_bootstrap_split(tpcomm_bootstrap boot, const int* ranks, size_t num_ranks,
                                     const char* tag, tpcomm_bootstrap* out);
/* Destroys the handle (NULL is allowed). A group built from it may outlive it. */
tpcomm_status tpcomm_bootstrap_destroy(tpcomm_bootstrap boot);
tpcomm_status tpcomm_bootstrap_rank_info(tpcomm_bootstrap boot, tpcomm_rank_info* out);
/* Returns when every rank has called it. Collective. */
tpcomm_status tpcomm_bootstrap_barrier(tpcomm_bootstrap boot);
/* This handle's last failure ("" when none). Never NULL. */
const char* tpcomm_bootstrap_last_error(tpcomm_bootstrap boot);

/* The bootstrap's key-value store, with keys in a namespace of their own (no clash with the
 * library's keys). Every call is bounded by `timeout_ms` (<= 0: TPCOMM_TIMEOUT_MS). Keys are
 * NUL-terminated and non-empty; values are bytes. */
tpcomm_status tpcomm_store_set(tpcomm_bootstrap boot, const char* key, const void* value,
                               size_t size, int64_t timeout_ms);
/* Waits for `key` and copies its value into `buf`; `size` receives the value's size. When the
 * value is larger than `capacity`, TPCOMM_INVALID_ARGUMENT with `size` set and `buf` untouched
 * (the key stays: call again with a larger buffer). */
tpcomm_status tpcomm_store_get(tpcomm_bootstrap boot, const char* key, void* buf, size_t capacity,
                               size_t* size, int64_t timeout_ms);
/* Adds `delta` to the counter at `key` (created as 0); `result` (optional) the new value. */
tpcomm_status tpcomm_store_add(tpcomm_bootstrap boot, const char* key, int64_t delta,
                               int64_t* result, int64_t timeout_ms);
/* `exists` receives 1 when `key` is set, else 0; does not wait. */
tpcomm_status tpcomm_store_check(tpcomm_bootstrap boot, const char* key, int* exists,
                                 int64_t timeout_ms);
/* Removes `key`; `existed` (optional) receives 1 when it was set. */
tpcomm_status tpcomm_store_erase(tpcomm_bootstrap boot, const char* key, int* existed,
                                 int64_t timeout_ms);

/* ---- groups ------------------------------------------------------------------------------- */

/* A group over the bootstrap's ranks on CUDA device `device` (`tpcomm::Group`); `config` NULL
 * allows every backend. Collective. Knobs from the TPCOMM_* variables. */
tpcomm_status tpcomm_group_create(tpcomm_bootstrap boot, int device,
                                  const tpcomm_group_config* config, tpcomm_group* out);
/* Destroys the group (NULL is allowed). Every capture scope of it must be ended first. */
tpcomm_status tpcomm_group_destroy(tpcomm_group group);

/* SGLang's parallelism flags (`tpcomm::ParallelConfig`: --tp-size, --dp-size,
 * --enable-dp-attention, --attn-cp-size, --ep-size, --moe-dp-size; 1 and 0 where unused). */
typedef struct tpcomm_parallel_config {
  int32_t tp_size;
  int32_t dp_size;
  int32_t enable_dp_attention;
  int32_t attn_cp_size;
  int32_t moe_ep_size;
  int32_t moe_dp_size;
} tpcomm_parallel_config;
/* The kinds of SGLang's parallel groups, in the order tpcomm_parallel_groups_create fills. */
typedef enum tpcomm_group_kind {
  TPCOMM_GROUP_TP = 0,
  TPCOMM_GROUP_ATTN_TP = 1,
  TPCOMM_GROUP_MOE_EP = 2,
  TPCOMM_GROUP_MOE_TP = 3
} tpcomm_group_kind;
/* The global ranks of `rank`'s group of `kind` on `world_size` ranks, in group-rank order, as
 * SGLang lays them out; `count` receives their number (also when `capacity` is too small, which
 * is TPCOMM_INVALID_ARGUMENT), `is_tp_group` (optional) 1 when the kind is served by the TP
 * group itself. Pure: no GPU, no communication. */
tpcomm_status tpcomm_parallel_layout(int world_size, const tpcomm_parallel_config* config, int kind,
                                     int rank, int* ranks, size_t capacity, size_t* count,
                                     int* is_tp_group);
/* SGLang's groups of this rank over `world` (whose size is `config->tp_size`) on `device`, as
 * `tpcomm::ParallelGroups`: `out[kind]` for each tpcomm_group_kind. Sub-groups are splits of
 * `world` (its store, no second port); a kind laid out like TP is a handle of TP's group. Each
 * handle is destroyed on its own with tpcomm_group_destroy. Collective over `world`. */
tpcomm_status tpcomm_parallel_groups_create(tpcomm_bootstrap world, int device,
                                            const tpcomm_parallel_config* config,
                                            tpcomm_group out[4]);
tpcomm_status tpcomm_group_rank_info(tpcomm_group group, tpcomm_rank_info* out);
/* TPCOMM_OK while usable, else the sticky failure (message in tpcomm_group_last_error). */
tpcomm_status tpcomm_group_health(tpcomm_group group);
/* Makes every waiting kernel of the group give up and every later call return TPCOMM_ABORTED. */
tpcomm_status tpcomm_group_abort(tpcomm_group group);
/* What the group's watchdog does when the group fails (`tpcomm::FailureMode`; the default is
 * TPCOMM_ASYNC_ERROR_HANDLING's, raise): mark it failed so that the next call fails; take the
 * process down (abort); or also call `fn(status, message, user)` on the watchdog's thread. */
typedef enum tpcomm_failure_mode {
  TPCOMM_FAILURE_RAISE = 0,
  TPCOMM_FAILURE_TEARDOWN = 1,
  TPCOMM_FAILURE_CALLBACK = 2
} tpcomm_failure_mode;
typedef void (*tpcomm_failure_fn)(int status, const char* message, void* user);
/* Sets the failure mode of `group`; `fn` (may be NULL) and `user` serve TPCOMM_FAILURE_CALLBACK.
 * Thread-safe. */
tpcomm_status tpcomm_group_set_failure_mode(tpcomm_group group, int mode, tpcomm_failure_fn fn,
                                            void* user);
/* Measures the custom all-reduce per size and installs the table on every rank (rank 0 stores
 * it in the tune file). Collective. */
tpcomm_status tpcomm_group_tune(tpcomm_group group);
/* Launches the group's kernels once on `stream` and meets every rank (`Group::warm_up`). */
tpcomm_status tpcomm_group_warm_up(tpcomm_group group, void* stream);
/* This handle's last failure ("" when none). Never NULL. */
const char* tpcomm_group_last_error(tpcomm_group group);

/* Which path would serve an operation (`Group::backend_for_*`): "local", "custom_ar:<name>",
 * "nccl", "nccl+add_rmsnorm", ... */
typedef enum tpcomm_op {
  TPCOMM_OP_ALL_REDUCE = 0,
  TPCOMM_OP_ALL_REDUCE_ADD_RMSNORM = 1, /* in: x, out: norm_out */
  TPCOMM_OP_ALL_GATHER = 2,
  TPCOMM_OP_ALL_TO_ALL = 3,
  TPCOMM_OP_MOE_FINALIZE = 4, /* in: x, the combine's output [tokens, hidden]; out: norm_out */
  TPCOMM_OP_REDUCE_SCATTER_ADD_RMSNORM = 5 /* in: x [tokens, hidden], all of it; out: norm_out */
} tpcomm_op;
/* Copies the backend's name into `buf` (NUL-terminated, truncated to `capacity`). */
tpcomm_status tpcomm_group_backend_for(tpcomm_group group, int op, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, int capturing, char* buf,
                                       size_t capacity);

/* ---- collectives: the arguments and rules of the `tpcomm::Group` methods of the same name -- */

tpcomm_status tpcomm_all_reduce(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, int op, void* stream);
tpcomm_status tpcomm_all_gather(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream);
/* `out` is used on rank `root` only, and may be NULL elsewhere. */
tpcomm_status tpcomm_gather(tpcomm_group group, const tpcomm_tensor* in, const tpcomm_tensor* out,
                            int root, void* stream);
tpcomm_status tpcomm_reduce_scatter(tpcomm_group group, const tpcomm_tensor* in,
                                    const tpcomm_tensor* out, int op, void* stream);
/* Equal split. */
tpcomm_status tpcomm_all_to_all(tpcomm_group group, const tpcomm_tensor* in,
                                const tpcomm_tensor* out, void* stream);
/* Per-peer counts: `counts[s * world_size + d]` elements go from rank s to rank d;
 * `num_counts` must be world_size^2. */
tpcomm_status tpcomm_all_to_all_counts(tpcomm_group group, const tpcomm_tensor* in,
                                       const tpcomm_tensor* out, const int64_t* counts,
                                       size_t num_counts, void* stream);
tpcomm_status tpcomm_broadcast(tpcomm_group group, const tpcomm_tensor* in,
                               const tpcomm_tensor* out, int root, void* stream);
tpcomm_status tpcomm_send(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream);
tpcomm_status tpcomm_recv(tpcomm_group group, const tpcomm_tensor* buf, int peer, void* stream);
/* residual_out = sum over ranks(x) + residual; norm_out = RMSNorm(residual_out) * gamma (or
 * 1 + gamma: `weight` is a tpcomm_norm_weight). `residual` NULL: none (residual_out is the sum).
 * `gamma` in x's dtype or f32. For an f8e4m3 `norm_out`, exactly one of `fp8_scale` (one f32,
 * read), `fp8_row_scales` ([tokens] f32, written) and `fp8_group_scales` ([tokens, hidden / 128]
 * f32, written) is given; otherwise all are NULL. */
tpcomm_status tpcomm_all_reduce_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* x, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream);
/* The sequence-parallel form (`tpcomm::Group::reduce_scatter_add_rmsnorm`): `x` [tokens, hidden]
 * summed over the ranks, each rank keeping its tokens / world rows (rank r the r-th share); then
 * tpcomm_all_reduce_add_rmsnorm's epilogue on them, with its arguments and rules (`residual`,
 * `norm_out`, `residual_out` [tokens / world, hidden]). */
tpcomm_status tpcomm_reduce_scatter_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* x, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream);
/* The local residual add + RMSNorm alone (`tpcomm::add_rmsnorm`), on `stream`. */
tpcomm_status tpcomm_add_rmsnorm(const tpcomm_tensor* x, const tpcomm_tensor* residual,
                                 const tpcomm_tensor* gamma, float eps,
                                 const tpcomm_tensor* norm_out, const tpcomm_tensor* residual_out,
                                 const tpcomm_tensor* fp8_scale,
                                 const tpcomm_tensor* fp8_row_scales,
                                 const tpcomm_tensor* fp8_group_scales, int weight, void* stream);
/* The end of a tensor-parallel MoE layer (`tpcomm::Group::moe_finalize_all_reduce_add_rmsnorm`):
 * x = sum over k of weights[t, k] * experts[map[t, k]] + shared[t] per token t (`experts`
 * [rows, hidden]; `map` int32 and `weights` (f32 or the experts' dtype) [tokens, top_k];
 * `shared` [tokens, hidden] or NULL), then the arguments of tpcomm_all_reduce_add_rmsnorm. */
tpcomm_status tpcomm_moe_finalize_all_reduce_add_rmsnorm(
    tpcomm_group group, const tpcomm_tensor* experts, const tpcomm_tensor* map,
    const tpcomm_tensor* weights, const tpcomm_tensor* shared, const tpcomm_tensor* residual,
    const tpcomm_tensor* gamma, float eps, const tpcomm_tensor* norm_out,
    const tpcomm_tensor* residual_out, const tpcomm_tensor* fp8_scale,
    const tpcomm_tensor* fp8_row_scales, const tpcomm_tensor* fp8_group_scales, int weight,
    void* stream);
/* The MoE combine alone (`tpcomm::moe_combine`) into `out` ([tokens, hidden]), on `stream`. */
tpcomm_status tpcomm_moe_combine(const tpcomm_tensor* experts, const tpcomm_tensor* map,
                                 const tpcomm_tensor* weights, const tpcomm_tensor* shared,
                                 const tpcomm_tensor* out, void* stream);
/* The LM head's exchange. `rows_per_rank` NULL: every rank holds `equal_rows` rows (graphs);
 * otherwise it has `num_ranks` (= world size) entries and `equal_rows` is ignored. */
tpcomm_status tpcomm_lm_head_exchange(tpcomm_group group, const tpcomm_tensor* shard_logits,
                                      const tpcomm_tensor* out, int64_t equal_rows,
                                      const int64_t* rows_per_rank, size_t num_ranks, void* stream);
/* Sets up the exchanges' staging (`bytes_per_peer` <= 0: 4 MiB) and NCCL's peer-to-peer
 * buffers. Collective; not graph-safe. */
tpcomm_status tpcomm_prepare_exchange(tpcomm_group group, int64_t bytes_per_peer, void* stream);

/* ---- CUDA-graph capture ------------------------------------------------------------------- */

/* Opens a capture scope on `stream` (before cudaStreamBeginCapture). */
tpcomm_status tpcomm_capture_begin(tpcomm_group group, void* stream, tpcomm_capture* out);
/* Closes the scope (after cudaStreamEndCapture: registers the captured buffers with every
 * rank, collective) and frees the handle, also when closing fails. NULL is allowed. */
tpcomm_status tpcomm_capture_end(tpcomm_capture scope);

#ifdef __cplusplus
}
#endif

#endif /* TPCOMM_TPCOMM_H */
