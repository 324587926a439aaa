/* SPDX-License-Identifier: Apache-2.0 */
/* The C API from C, without a GPU: version, `tpcomm info`, status codes and messages for bad
 * arguments, and a bootstrap of four processes over the real TCP store with explicit values,
 * with the store calls between them. Exits 0 when every check passes. */
#define _POSIX_C_SOURCE 200809L

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "tpcomm/tpcomm.h"

/* A call that must fail with `status` and a thread-local message containing `needle`. */
#define CHECK_FAILS(call, status, needle)                                                          \
  do {                                                                                             \
    const tpcomm_status s_ = (call);                                                               \
    if (s_ != (status) || strstr(tpcomm_last_error(), (needle)) == NULL) {                         \
      fprintf(stderr, "%s:%d: %s returned %s (%s), expected %s with \"%s\"\n", __FILE__, __LINE__, \
              #call, tpcomm_status_string(s_), tpcomm_last_error(), tpcomm_status_string(status),  \
              (needle));                                                                           \
      ++failures;                                                                                  \
    }                                                                                              \
  } while (0)

static void test_version(void) {
  const char* version = NULL;
  int number = -1;
  CHECK_OK(tpcomm_version(&version, &number));
  CHECK(number == TPCOMM_VERSION_NUMBER);
  char expected[32];
  snprintf(expected, sizeof expected, "%d.%d.%d", TPCOMM_VERSION_MAJOR, TPCOMM_VERSION_MINOR,
           TPCOMM_VERSION_PATCH);
  CHECK(version != NULL && strcmp(version, expected) == 0);
  CHECK_OK(tpcomm_version(NULL, NULL));
  CHECK(strcmp(tpcomm_status_string(TPCOMM_OK), "ok") == 0);
  CHECK(strcmp(tpcomm_status_string(TPCOMM_TIMEOUT), "timeout") == 0);
  CHECK(strcmp(tpcomm_status_string(TPCOMM_INVALID_ARGUMENT), "invalid argument") == 0);
  CHECK(strcmp(tpcomm_status_string(-1), "unknown") == 0);
  CHECK(strcmp(tpcomm_status_string(TPCOMM_MISMATCH), "mismatch") == 0);
  CHECK(strcmp(tpcomm_status_string(TPCOMM_MISMATCH + 1), "unknown") == 0);
}

static void test_info(void) {
  for (int as_json = 0; as_json <= 1; ++as_json) {
    size_t needed = 0;
    int invalid = -1;
    CHECK_OK(tpcomm_info(as_json, NULL, 0, &needed, &invalid));
    CHECK(needed > 100);
    CHECK(invalid == 0);
    char* buf = malloc(needed);
    CHECK(buf != NULL);
    if (buf == NULL) return;
    /* One byte short: refused, nothing written. */
    buf[0] = 'x';
    CHECK_FAILS(tpcomm_info(as_json, buf, needed - 1, NULL, NULL), TPCOMM_INVALID_ARGUMENT,
                "bytes");
    CHECK(buf[0] == 'x');
    CHECK_OK(tpcomm_info(as_json, buf, needed, NULL, NULL));
    CHECK(strlen(buf) + 1 == needed);
    if (as_json) {
      CHECK(buf[0] == '{');
      CHECK(strstr(buf, "\"knobs\"") != NULL);
      CHECK(strstr(buf, "\"version\": \"") != NULL);
    } else {
      CHECK(strncmp(buf, "tpcomm ", 7) == 0);
      CHECK(strstr(buf, "\nCUDA driver: ") != NULL);
      CHECK(strstr(buf, "\nNCCL: ") != NULL);
      CHECK(strstr(buf, "TPCOMM_TIMEOUT_MS") != NULL);
    }
    free(buf);
  }
  CHECK_FAILS(tpcomm_info(0, NULL, 10, NULL, NULL), TPCOMM_INVALID_ARGUMENT, "buf is NULL");
}

static void test_bad_arguments(void) {
  tpcomm_bootstrap boot = NULL;
  CHECK_FAILS(tpcomm_bootstrap_create(2, 2, -1, -1, "127.0.0.1", 1234, &boot),
              TPCOMM_INVALID_ARGUMENT, "rank 2 is outside 0..1");
  CHECK(boot == NULL);
  CHECK_FAILS(tpcomm_bootstrap_create(0, 0, -1, -1, "127.0.0.1", 1234, &boot),
              TPCOMM_INVALID_ARGUMENT, "world_size is 0");
  CHECK_FAILS(tpcomm_bootstrap_create(0, 2, -1, -1, "127.0.0.1", 0, &boot), TPCOMM_INVALID_ARGUMENT,
              "store_port 0 is outside 1..65535");
  CHECK_FAILS(tpcomm_bootstrap_create(0, 2, -1, -1, NULL, 1234, &boot), TPCOMM_INVALID_ARGUMENT,
              "store_host");
  CHECK_FAILS(tpcomm_bootstrap_create(0, 2, 0, -1, "127.0.0.1", 1234, &boot),
              TPCOMM_INVALID_ARGUMENT, "local_rank and local_world_size");
  CHECK_FAILS(tpcomm_bootstrap_create(0, 1, 0, 1, NULL, 0, NULL), TPCOMM_INVALID_ARGUMENT,
              "out is NULL");
  /* Every message names the function. */
  CHECK(strncmp(tpcomm_last_error(), "tpcomm_bootstrap_create: ", 25) == 0);

  CHECK_FAILS(tpcomm_bootstrap_barrier(NULL), TPCOMM_INVALID_ARGUMENT, "boot is NULL");
  CHECK_FAILS(tpcomm_store_set(NULL, "k", "v", 1, 0), TPCOMM_INVALID_ARGUMENT, "boot is NULL");
  CHECK_FAILS(tpcomm_group_create(NULL, 0, NULL, NULL), TPCOMM_INVALID_ARGUMENT, "boot is NULL");
  CHECK_FAILS(tpcomm_group_health(NULL), TPCOMM_INVALID_ARGUMENT, "group is NULL");
  CHECK_FAILS(tpcomm_group_set_failure_mode(NULL, TPCOMM_FAILURE_TEARDOWN, NULL, NULL),
              TPCOMM_INVALID_ARGUMENT, "tpcomm_group_set_failure_mode: group is NULL");
  CHECK_FAILS(tpcomm_all_reduce(NULL, NULL, NULL, TPCOMM_SUM, NULL), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_all_reduce: group is NULL");
  CHECK(strcmp(tpcomm_group_last_error(NULL), "") == 0);
  CHECK(strcmp(tpcomm_bootstrap_last_error(NULL), "") == 0);
  CHECK_OK(tpcomm_bootstrap_destroy(NULL));
  CHECK_OK(tpcomm_group_destroy(NULL));
  CHECK_OK(tpcomm_capture_end(NULL));

  /* Tensors are checked before anything runs (the local add + RMSNorm needs no group). */
  float x[4] = {0};
  tpcomm_tensor t = {x, TPCOMM_F32, 1, -1, 0, {4}};
  tpcomm_tensor bad = t;
  bad.dtype = 42;
  CHECK_FAILS(tpcomm_add_rmsnorm(&bad, &t, &t, 1e-6f, &t, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "x: dtype 42 is not a tpcomm_dtype");
  bad = t;
  bad.ndim = 7;
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &bad, &t, 1e-6f, &t, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "residual: ndim 7 is outside 0..6");
  bad = t;
  bad.shape[0] = -3;
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &bad, 1e-6f, &t, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "gamma: shape[0] is -3");
  bad = t;
  bad.ndim = 3;
  bad.shape[0] = bad.shape[1] = bad.shape[2] = (int64_t)1 << 30;
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &bad, 1e-6f, &t, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "gamma: the shape's element count overflows");
  bad = t;
  bad.data = NULL;
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &t, 1e-6f, &bad, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "norm_out: data is NULL for 4 elements");
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &t, 1e-6f, &t, NULL, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "residual_out is NULL");
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &t, 1e-6f, &t, &t, NULL, NULL, NULL, 7, NULL),
              TPCOMM_INVALID_ARGUMENT, "weight 7 is not a tpcomm_norm_weight (0 or 1)");
  /* What only the operation's own checks see is said too, not left to the log. */
  bad = t;
  bad.shape[0] = 3;
  CHECK_FAILS(tpcomm_add_rmsnorm(&t, &t, &bad, 1e-6f, &t, &t, NULL, NULL, NULL, 0, NULL),
              TPCOMM_INVALID_ARGUMENT, "gamma must hold 4 elements of float (it holds 3");

  /* The MoE combine: 3 expert rows of hidden 4, 2 tokens with top-2, checked before it runs. */
  float experts_data[12] = {0}, weights_data[4] = {0}, out_data[8] = {0};
  int32_t map_data[4] = {0};
  tpcomm_tensor experts = {experts_data, TPCOMM_F32, 2, -1, 0, {3, 4}};
  tpcomm_tensor map = {map_data, TPCOMM_I32, 2, -1, 0, {2, 2}};
  tpcomm_tensor weights = {weights_data, TPCOMM_F32, 2, -1, 0, {2, 2}};
  tpcomm_tensor out = {out_data, TPCOMM_F32, 2, -1, 0, {2, 4}};
  tpcomm_tensor wrong = map;
  wrong.dtype = TPCOMM_I64;
  CHECK_FAILS(tpcomm_moe_combine(&experts, &wrong, &weights, NULL, &out, NULL),
              TPCOMM_INVALID_ARGUMENT, "tpcomm_moe_combine: map must be int32 [tokens, top_k]");
  wrong = weights;
  wrong.shape[1] = 3;
  CHECK_FAILS(tpcomm_moe_combine(&experts, &map, &wrong, NULL, &out, NULL), TPCOMM_INVALID_ARGUMENT,
              "weights must be [2, 2] of f32 or float");
  wrong = out;
  wrong.shape[1] = 3;
  CHECK_FAILS(tpcomm_moe_combine(&experts, &map, &weights, NULL, &wrong, NULL),
              TPCOMM_INVALID_ARGUMENT, "the combined output must be [2, 4] of float");
  CHECK_FAILS(tpcomm_moe_combine(&experts, &map, &weights, &wrong, &out, NULL),
              TPCOMM_INVALID_ARGUMENT, "shared must be [2, 4] of float");
  wrong = out;
  wrong.data = experts_data + 4;
  CHECK_FAILS(tpcomm_moe_combine(&experts, &map, &weights, NULL, &wrong, NULL),
              TPCOMM_INVALID_ARGUMENT, "the output overlaps experts");
  wrong = map;
  wrong.shape[1] = 33;
  CHECK_FAILS(tpcomm_moe_combine(&experts, &wrong, &weights, NULL, &out, NULL),
              TPCOMM_INVALID_ARGUMENT, "top_k is 33; 1 to 32 expected");
  CHECK_FAILS(
      tpcomm_moe_finalize_all_reduce_add_rmsnorm(NULL, &experts, &map, &weights, NULL, NULL, &t,
                                                 1e-6f, &out, &out, NULL, NULL, NULL, 0, NULL),
      TPCOMM_INVALID_ARGUMENT, "tpcomm_moe_finalize_all_reduce_add_rmsnorm: group is NULL");
}

/* A single process: no socket, an in-process store; every store call. */
static void test_world_of_one(void) {
  tpcomm_bootstrap boot = NULL;
  CHECK_OK(tpcomm_bootstrap_create(0, 1, -1, -1, NULL, 0, &boot));
  if (boot == NULL) return;
  tpcomm_rank_info info;
  CHECK_OK(tpcomm_bootstrap_rank_info(boot, &info));
  CHECK(info.rank == 0 && info.world_size == 1 && info.local_rank == 0 &&
        info.local_world_size == 1 && info.node_id == 0 && info.device == -1);
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_store_set(boot, "greeting", "hello", 5, 0));
  char buf[8] = {0};
  size_t size = 0;
  CHECK_OK(tpcomm_store_get(boot, "greeting", buf, sizeof buf, &size, 0));
  CHECK(size == 5 && memcmp(buf, "hello", 5) == 0);
  /* Too small: the size is reported, the buffer untouched, the key kept. */
  memset(buf, 'z', sizeof buf);
  if (tpcomm_store_get(boot, "greeting", buf, 2, &size, 0) != TPCOMM_INVALID_ARGUMENT) ++failures;
  CHECK(size == 5 && buf[0] == 'z');
  CHECK(strstr(tpcomm_bootstrap_last_error(boot), "has 5 bytes, the buffer 2") != NULL);
  int exists = -1;
  CHECK_OK(tpcomm_store_check(boot, "greeting", &exists, 0));
  CHECK(exists == 1);
  int existed = -1;
  CHECK_OK(tpcomm_store_erase(boot, "greeting", &existed, 0));
  CHECK(existed == 1);
  CHECK_OK(tpcomm_store_check(boot, "greeting", &exists, 0));
  CHECK(exists == 0);
  int64_t v = 0;
  CHECK_OK(tpcomm_store_add(boot, "counter", 5, &v, 0));
  CHECK_OK(tpcomm_store_add(boot, "counter", -2, &v, 0));
  CHECK(v == 3);
  /* A key never set: a timeout naming the key, on the handle and on the thread. */
  CHECK_FAILS(tpcomm_store_get(boot, "missing", buf, sizeof buf, &size, 100), TPCOMM_TIMEOUT,
              "missing");
  CHECK(strstr(tpcomm_bootstrap_last_error(boot), "missing") != NULL);
  CHECK_FAILS(tpcomm_store_set(boot, "", "v", 1, 0), TPCOMM_INVALID_ARGUMENT,
              "key is NULL or empty");
  CHECK_FAILS(tpcomm_store_get(boot, "counter", NULL, 4, &size, 0), TPCOMM_INVALID_ARGUMENT,
              "buf is NULL");
  CHECK_FAILS(tpcomm_group_create(boot, -1, NULL, NULL), TPCOMM_INVALID_ARGUMENT, "out is NULL");
  tpcomm_group group = NULL;
  const tpcomm_group_config config = {1, 1, 1, 0, -5, 0};
  CHECK_FAILS(tpcomm_group_create(boot, 0, &config, &group), TPCOMM_INVALID_ARGUMENT,
              "config: fusion_max_tokens -5 and fusion_hidden 0 must be >= 0");
  CHECK(group == NULL);
  /* Rows that would size an 8 GiB Lamport slot: refused like TPCOMM_FUSION_MAX_TOKENS x HIDDEN. */
  const tpcomm_group_config huge = {1, 1, 1, 0, 65536, 65536};
  CHECK_FAILS(tpcomm_group_create(boot, 0, &huge, &group), TPCOMM_INVALID_ARGUMENT,
              "fusion_max_tokens 65536 x fusion_hidden 65536 rows of 2 bytes are more than");
  CHECK(group == NULL);
  /* A determinism that is not a tpcomm_determinism. */
  const tpcomm_group_config odd = {1, 1, 1, TPCOMM_DETERMINISM_STRICT + 1, 0, 0};
  CHECK_FAILS(tpcomm_group_create(boot, 0, &odd, &group), TPCOMM_INVALID_ARGUMENT,
              "config: deterministic 4 is not a tpcomm_determinism");
  CHECK(group == NULL);
  /* A sub-group: shares the store, its own key namespace, this rank's index in it. */
  const int mine[] = {0};
  const int others[] = {1};
  tpcomm_bootstrap sub = NULL;
  CHECK_OK(tpcomm_bootstrap_split(boot, mine, 1, "tp", &sub));
  CHECK_OK(tpcomm_bootstrap_rank_info(sub, &info));
  CHECK(info.rank == 0 && info.world_size == 1);
  CHECK_OK(tpcomm_bootstrap_barrier(sub));
  CHECK_OK(tpcomm_bootstrap_destroy(sub));
  CHECK_FAILS(tpcomm_bootstrap_split(boot, NULL, 0, "tp", &sub), TPCOMM_INVALID_ARGUMENT,
              "ranks is NULL or empty");
  CHECK_FAILS(tpcomm_bootstrap_split(boot, mine, 1, NULL, &sub), TPCOMM_INVALID_ARGUMENT,
              "tag is NULL");
  CHECK_FAILS(tpcomm_bootstrap_split(boot, mine, 1, "a/b", &sub), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_bootstrap_split: ");
  CHECK_FAILS(tpcomm_bootstrap_split(boot, others, 1, "tp", &sub), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_bootstrap_split: ");
  CHECK(sub == NULL);
  CHECK_OK(tpcomm_bootstrap_split(boot, mine, 1, "tp", &sub));
  CHECK_OK(tpcomm_bootstrap_destroy(boot));
  /* The sub-group outlives the bootstrap it was split from. */
  CHECK_OK(tpcomm_bootstrap_barrier(sub));
  CHECK_OK(tpcomm_bootstrap_destroy(sub));
  /* A destroyed handle, or one never made, is refused rather than read. */
  CHECK_FAILS(tpcomm_bootstrap_destroy(boot), TPCOMM_INVALID_ARGUMENT, "destroyed already");
  CHECK_FAILS(tpcomm_store_add(boot, "counter", 1, &v, 0), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_store_add: boot was destroyed");
  CHECK_FAILS(tpcomm_bootstrap_barrier(boot), TPCOMM_INVALID_ARGUMENT, "boot was destroyed");
  CHECK(strcmp(tpcomm_bootstrap_last_error(boot), "") == 0);
  tpcomm_group never = (tpcomm_group)(void*)buf;
  CHECK_FAILS(tpcomm_group_destroy(never), TPCOMM_INVALID_ARGUMENT, "destroyed already");
  CHECK_FAILS(tpcomm_group_health(never), TPCOMM_INVALID_ARGUMENT, "group was destroyed");
  CHECK(strcmp(tpcomm_group_last_error(never), "") == 0);
  CHECK_FAILS(tpcomm_capture_end((tpcomm_capture)(void*)buf), TPCOMM_INVALID_ARGUMENT,
              "ended already");
}

/* Handles are typed: one of another kind is refused, naming both kinds, and nothing is done to
 * it (a bootstrap passed as a group is neither read as a group nor destroyed). */
static void test_wrong_kind(void) {
  tpcomm_bootstrap boot = NULL;
  CHECK_OK(tpcomm_bootstrap_create(0, 1, -1, -1, NULL, 0, &boot));
  if (boot == NULL) return;
  tpcomm_group as_group = (tpcomm_group)(void*)boot;
  CHECK_FAILS(tpcomm_group_abort(as_group), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_group_abort: group is a tpcomm_bootstrap, not a tpcomm_group");
  CHECK_FAILS(tpcomm_group_health(as_group), TPCOMM_INVALID_ARGUMENT,
              "group is a tpcomm_bootstrap, not a tpcomm_group");
  CHECK_FAILS(tpcomm_group_destroy(as_group), TPCOMM_INVALID_ARGUMENT,
              "tpcomm_group_destroy: group is a tpcomm_bootstrap, not a tpcomm_group");
  CHECK(strcmp(tpcomm_group_last_error(as_group), "") == 0);
  CHECK_FAILS(tpcomm_capture_end((tpcomm_capture)(void*)boot), TPCOMM_INVALID_ARGUMENT,
              "scope is a tpcomm_bootstrap, not a tpcomm_capture");
  /* Still alive and still a bootstrap. */
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_bootstrap_destroy(boot));
}

/* A free TCP port on loopback (released again: the store server binds it moments later). */
static int free_port(void) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, (struct sockaddr*)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr*)&addr, &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

enum { kWorld = 4 };

/* One rank of the multi-process test; returns its number of failed checks. */
static int run_rank(int rank, int port) {
  tpcomm_bootstrap boot = NULL;
  CHECK_OK(tpcomm_bootstrap_create(rank, kWorld, rank, kWorld, "127.0.0.1", port, &boot));
  if (boot == NULL) return failures;
  tpcomm_rank_info info;
  CHECK_OK(tpcomm_bootstrap_rank_info(boot, &info));
  CHECK(info.rank == rank && info.world_size == kWorld && info.local_rank == rank &&
        info.local_world_size == kWorld && info.node_id == 0);

  char key[32];
  char value[32];
  snprintf(key, sizeof key, "rank/%d", rank);
  snprintf(value, sizeof value, "value of rank %d", rank);
  CHECK_OK(tpcomm_store_set(boot, key, value, strlen(value), 0));
  int64_t counter = 0;
  CHECK_OK(tpcomm_store_add(boot, "arrivals", 1, &counter, 0));
  CHECK(counter >= 1 && counter <= kWorld);
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_store_add(boot, "arrivals", 0, &counter, 0));
  CHECK(counter == kWorld);
  for (int peer = 0; peer < kWorld; ++peer) {
    char want[32];
    char got[32] = {0};
    size_t size = 0;
    snprintf(key, sizeof key, "rank/%d", peer);
    snprintf(want, sizeof want, "value of rank %d", peer);
    CHECK_OK(tpcomm_store_get(boot, key, got, sizeof got - 1, &size, 0));
    CHECK(size == strlen(want) && memcmp(got, want, size) == 0);
  }
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_bootstrap_destroy(boot));
  return failures;
}

static void test_processes(void) {
  const int port = free_port();
  CHECK(port > 0);
  if (port <= 0) return;
  pid_t pids[kWorld];
  for (int r = 0; r < kWorld; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      alarm(120); /* a rank that never finishes is killed, and fails the test */
      _exit(run_rank(r, port) == 0 ? 0 : 1);
    }
    CHECK(pids[r] > 0);
  }
  for (int r = 0; r < kWorld; ++r) {
    if (pids[r] <= 0) continue;
    int status = 0;
    CHECK(waitpid(pids[r], &status, 0) == pids[r]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (wait status %d)\n", r, status);
      ++failures;
    }
  }
}

static void test_parallel_layout(void) {
  /* tp 8, dp 2 with DP attention: attention TP of 4 contiguous ranks; MoE EP of one rank. */
  const tpcomm_parallel_config config = {8, 2, 1, 1, 1, 1};
  int ranks[8] = {0};
  size_t count = 0;
  int is_tp = -1;
  CHECK_OK(tpcomm_parallel_layout(8, &config, TPCOMM_GROUP_ATTN_TP, 5, ranks, 8, &count, &is_tp));
  CHECK(count == 4 && ranks[0] == 4 && ranks[1] == 5 && ranks[2] == 6 && ranks[3] == 7);
  CHECK(is_tp == 0);
  CHECK_OK(tpcomm_parallel_layout(8, &config, TPCOMM_GROUP_TP, 5, ranks, 8, &count, &is_tp));
  CHECK(count == 8 && ranks[7] == 7 && is_tp == 1);
  CHECK_OK(tpcomm_parallel_layout(8, &config, TPCOMM_GROUP_MOE_EP, 5, ranks, 8, &count, NULL));
  CHECK(count == 1 && ranks[0] == 5);
  /* Too small a buffer: the size needed, and an error. */
  CHECK_FAILS(tpcomm_parallel_layout(8, &config, TPCOMM_GROUP_TP, 0, ranks, 2, &count, NULL),
              TPCOMM_INVALID_ARGUMENT, "capacity 2 is below the group's 8 ranks");
  CHECK(count == 8);
  const tpcomm_parallel_config bad = {6, 1, 0, 1, 4, 1};
  CHECK_FAILS(tpcomm_parallel_layout(6, &bad, TPCOMM_GROUP_TP, 0, ranks, 8, &count, NULL),
              TPCOMM_INVALID_ARGUMENT, "tp_size 6 is not divisible by moe_ep_size 4");
  CHECK_FAILS(tpcomm_parallel_layout(8, &config, 4, 0, ranks, 8, &count, NULL),
              TPCOMM_INVALID_ARGUMENT, "kind 4 is not a tpcomm_group_kind");
  CHECK_FAILS(tpcomm_parallel_layout(8, NULL, 0, 0, ranks, 8, &count, NULL),
              TPCOMM_INVALID_ARGUMENT, "config is NULL");
  CHECK_FAILS(tpcomm_parallel_layout(8, &config, 0, 8, ranks, 8, &count, NULL),
              TPCOMM_INVALID_ARGUMENT, "tpcomm_parallel_layout: ");
  /* The groups themselves: arguments checked before any device is touched. */
  tpcomm_group groups[4] = {NULL, NULL, NULL, NULL};
  CHECK_FAILS(tpcomm_parallel_groups_create(NULL, 0, &config, groups), TPCOMM_INVALID_ARGUMENT,
              "world is NULL");
  tpcomm_bootstrap boot = NULL;
  CHECK_OK(tpcomm_bootstrap_create(0, 1, -1, -1, "127.0.0.1", 0, &boot));
  CHECK_FAILS(tpcomm_parallel_groups_create(boot, 0, &config, groups), TPCOMM_INVALID_ARGUMENT,
              "world_size 1 != tp_size 8");
  CHECK(groups[0] == NULL && groups[3] == NULL);
  CHECK_FAILS(tpcomm_parallel_groups_create(boot, 0, NULL, groups), TPCOMM_INVALID_ARGUMENT,
              "config is NULL");
  CHECK_OK(tpcomm_bootstrap_destroy(boot));
}

int main(void) {
  /* First, while this process has no threads that a fork could cut off. */
  test_processes();
  test_version();
  test_info();
  test_bad_arguments();
  test_world_of_one();
  test_wrong_kind();
  test_parallel_layout();
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("C API: all checks passed\n");
  return 0;
}
