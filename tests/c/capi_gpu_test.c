/* SPDX-License-Identifier: Apache-2.0 */
/* The C API from C on GPUs, one process per rank (`tpcomm launch -n N`, torchrun): a group from
 * the environment, an exact all-reduce (eager, then replayed in a CUDA graph with new data),
 * an all-gather, a bad argument, health and abort. Ranks share GPU 0 when
 * there are fewer GPUs than ranks. Exits 77 (skipped) without a GPU. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tpcomm/tpcomm.h"

#define CHECK_CUDA(call) CHECK((call) == cudaSuccess)

enum { kCount = 4099 }; /* not a multiple of any vector width */

/* Rank r's element i: small integers, so that every sum is exact in f32. */
static float value(int rank, int i, int round) { return (float)((rank + 1) * (i % 13 + round)); }

/* Fills `dev` with rank `rank`'s data for `round`, poisons `out` (NaN bytes). */
static void fill(float* dev, float* out, int rank, int round, cudaStream_t s) {
  static float host[kCount];
  for (int i = 0; i < kCount; ++i) host[i] = value(rank, i, round);
  CHECK_CUDA(cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, s));
  CHECK_CUDA(cudaMemsetAsync(out, 0xFF, sizeof host, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
}

/* Number of elements of `out` that differ from the exact sum over `world` ranks. */
static int wrong(const float* out, int world, int round) {
  static float host[kCount];
  CHECK_CUDA(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < kCount; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += value(r, i, round);
    if (memcmp(&host[i], &want, sizeof want) != 0) ++bad;
  }
  return bad;
}

int main(void) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("no CUDA device: skipped\n");
    return 77;
  }
  tpcomm_bootstrap boot = NULL;
  CHECK_OK(tpcomm_bootstrap_from_env(&boot));
  if (boot == NULL) return 1;
  tpcomm_rank_info who;
  CHECK_OK(tpcomm_bootstrap_rank_info(boot, &who));
  const int device = who.local_rank % devices;
  CHECK_CUDA(cudaSetDevice(device));
  tpcomm_group group = NULL;
  CHECK_OK(tpcomm_group_create(boot, device, NULL, &group));
  if (group == NULL) return 1;
  tpcomm_rank_info ginfo;
  CHECK_OK(tpcomm_group_rank_info(group, &ginfo));
  CHECK(ginfo.rank == who.rank && ginfo.world_size == who.world_size && ginfo.device == device);

  cudaStream_t stream = NULL;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* in = NULL;
  float* out = NULL;
  CHECK_CUDA(cudaMalloc((void**)&in, kCount * sizeof(float)));
  CHECK_CUDA(cudaMalloc((void**)&out, kCount * sizeof(float)));
  const tpcomm_tensor tin = {in, TPCOMM_F32, 1, device, 0, {kCount}};
  const tpcomm_tensor tout = {out, TPCOMM_F32, 1, device, 0, {kCount}};

  char backend[64] = {0};
  CHECK_OK(tpcomm_group_backend_for(group, TPCOMM_OP_ALL_REDUCE, &tin, &tout, 0, backend,
                                    sizeof backend));
  printf("rank %d of %d, GPU %d: all-reduce of %d floats by %s\n", who.rank, who.world_size, device,
         kCount, backend);

  /* Eager. */
  fill(in, out, who.rank, 0, stream);
  CHECK_OK(tpcomm_all_reduce(group, &tin, &tout, TPCOMM_SUM, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(wrong(out, who.world_size, 0) == 0);

  /* Captured once, replayed with new data. */
  tpcomm_capture scope = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  CHECK_OK(tpcomm_capture_begin(group, stream, &scope));
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_OK(tpcomm_all_reduce(group, &tin, &tout, TPCOMM_SUM, stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_OK(tpcomm_capture_end(scope));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  for (int round = 1; round <= 3; ++round) {
    fill(in, out, who.rank, round, stream);
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK(wrong(out, who.world_size, round) == 0);
  }

  /* All-gather of int32 over the exchange's staging (set up first, as engines do). */
  CHECK_OK(tpcomm_prepare_exchange(group, 0, stream));
  {
    enum { kPer = 1001 };
    int32_t* host = malloc((size_t)kPer * (size_t)who.world_size * sizeof(int32_t));
    int32_t* gin = NULL;
    int32_t* gout = NULL;
    const size_t out_bytes = (size_t)kPer * (size_t)who.world_size * sizeof(int32_t);
    CHECK_CUDA(cudaMalloc((void**)&gin, kPer * sizeof(int32_t)));
    CHECK_CUDA(cudaMalloc((void**)&gout, out_bytes));
    for (int i = 0; i < kPer; ++i) host[i] = who.rank * 100000 + i;
    CHECK_CUDA(cudaMemcpy(gin, host, kPer * sizeof(int32_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(gout, 0xFF, out_bytes));
    const tpcomm_tensor tgin = {gin, TPCOMM_I32, 1, device, 0, {kPer}};
    const tpcomm_tensor tgout = {gout, TPCOMM_I32, 1, device, 0, {(int64_t)kPer * who.world_size}};
    CHECK_OK(tpcomm_all_gather(group, &tgin, &tgout, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaMemcpy(host, gout, out_bytes, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < who.world_size; ++r)
      for (int i = 0; i < kPer; ++i) bad += host[r * kPer + i] != r * 100000 + i;
    CHECK(bad == 0);
    /* Gather to the last rank: the others pass no output. */
    const int root = who.world_size - 1;
    CHECK_CUDA(cudaMemset(gout, 0xFF, out_bytes));
    CHECK_OK(tpcomm_gather(group, &tgin, who.rank == root ? &tgout : NULL, root, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    if (who.rank == root) {
      CHECK_CUDA(cudaMemcpy(host, gout, out_bytes, cudaMemcpyDeviceToHost));
      for (int r = 0; r < who.world_size; ++r)
        for (int i = 0; i < kPer; ++i) bad += host[r * kPer + i] != r * 100000 + i;
      CHECK(bad == 0);
    }
    CHECK(tpcomm_gather(group, &tgin, &tgout, who.world_size, stream) == TPCOMM_INVALID_ARGUMENT);
    CHECK(strstr(tpcomm_group_last_error(group), "root") != NULL);
    free(host);
    CHECK_CUDA(cudaFree(gin));
    CHECK_CUDA(cudaFree(gout));
  }

  /* A bad argument: refused with the group's message, the group stays usable. */
  const tpcomm_tensor half = {out, TPCOMM_F32, 1, device, 0, {kCount / 2}};
  const tpcomm_status s = tpcomm_all_reduce(group, &tin, &half, TPCOMM_SUM, stream);
  CHECK(s == TPCOMM_INVALID_ARGUMENT);
  CHECK(strncmp(tpcomm_group_last_error(group), "tpcomm_all_reduce: ", 19) == 0);
  CHECK(strlen(tpcomm_group_last_error(group)) > 19);
  CHECK(tpcomm_all_reduce(group, &tin, &tout, 17, stream) == TPCOMM_INVALID_ARGUMENT);
  CHECK(strstr(tpcomm_last_error(), "op 17 is not a tpcomm_reduce_op") != NULL);
  CHECK(tpcomm_group_health(group) == TPCOMM_OK);

  /* A launch that fails names its CUDA error: the local add + RMSNorm into a capture that a
   * synchronising call made invalid. */
  {
    cudaStream_t cap = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaStreamSynchronize(cap) != cudaSuccess); /* illegal under capture: invalidates it */
    const tpcomm_tensor x = {in, TPCOMM_F32, 2, device, 0, {1, 64}};
    const tpcomm_tensor gamma = {out, TPCOMM_F32, 1, device, 0, {64}};
    const tpcomm_tensor res_out = {out + 64, TPCOMM_F32, 2, device, 0, {1, 64}};
    CHECK(tpcomm_add_rmsnorm(&x, NULL, &gamma, 1e-6f, &x, &res_out, NULL, NULL, NULL, 0, cap) ==
          TPCOMM_CUDA_ERROR);
    CHECK(strstr(tpcomm_last_error(), "could not be launched on the stream: cudaError") != NULL);
    printf("rank %d: %s\n", who.rank, tpcomm_last_error());
    cudaGraph_t broken = NULL;
    (void)cudaStreamEndCapture(cap, &broken);
    if (broken != NULL) cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    CHECK_CUDA(cudaStreamDestroy(cap));
  }

  /* After abort every call says so. */
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_group_abort(group));
  CHECK(tpcomm_group_health(group) == TPCOMM_ABORTED);
  CHECK(tpcomm_all_reduce(group, &tin, &tout, TPCOMM_SUM, stream) == TPCOMM_ABORTED);

  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_OK(tpcomm_group_destroy(group));
  CHECK_OK(tpcomm_bootstrap_barrier(boot));
  CHECK_OK(tpcomm_bootstrap_destroy(boot));
  CHECK_CUDA(cudaFree(in));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (failures != 0) {
    fprintf(stderr, "rank %d: %d check(s) failed\n", who.rank, failures);
    return 1;
  }
  printf("rank %d: C API on the GPU: all checks passed\n", who.rank);
  return 0;
}
