// SPDX-License-Identifier: Apache-2.0
// A scriptable stand-in for NCCL 2.28 that moves no data: the test chooses, through
// `tpcomm_scripted_nccl_set_mode` (tests/support/scripted.hpp), how calls answer (in progress
// forever, an asynchronous error, an invalid argument), and reads back how often the communicator
// was aborted or destroyed and which point-to-point calls it received. It exports ncclCommFinalize
// but not ncclAlltoAll, so NcclComm's all-to-all takes the grouped send/receive path.
#include "support/scripted.hpp"

#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

using tpcomm::test::ScriptedMode;

struct P2PCall {
  int is_send;
  int peer;
  const void* buffer;
  size_t count;
};

std::atomic<int> g_mode{static_cast<int>(ScriptedMode::kHealthy)};
std::atomic<int> g_aborts{0};
std::atomic<int> g_destroys{0};

ScriptedMode mode() { return static_cast<ScriptedMode>(g_mode.load()); }

ncclResult_t op_result() {
  switch (mode()) {
    case ScriptedMode::kOpsFailAsynchronously:
    case ScriptedMode::kOpsNeverComplete:
      return ncclInProgress;
    case ScriptedMode::kOpsInvalidArgument:
      return ncclInvalidArgument;
    default:
      return ncclSuccess;
  }
}

}  // namespace

struct ncclComm {
  int rank = 0;
  int nranks = 1;
  std::mutex mutex;
  std::vector<P2PCall> p2p;
};

extern "C" {

void tpcomm_scripted_nccl_set_mode(int mode) { g_mode = mode; }
int tpcomm_scripted_nccl_aborts() { return g_aborts; }
int tpcomm_scripted_nccl_destroys() { return g_destroys; }
int tpcomm_scripted_nccl_p2p(ncclComm_t comm, int index, int* is_send, int* peer,
                             const void** buffer, size_t* count) {
  std::lock_guard lock(comm->mutex);
  if (index < 0 || static_cast<size_t>(index) >= comm->p2p.size()) return 0;
  const P2PCall& c = comm->p2p[static_cast<size_t>(index)];
  *is_send = c.is_send;
  *peer = c.peer;
  *buffer = c.buffer;
  *count = c.count;
  return 1;
}

ncclResult_t ncclGetVersion(int* version) {
  *version = 22809;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) { return "scripted NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return "scripted last error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0x5a, sizeof(*id));
  return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t*) {
  *comm = new ncclComm;
  (*comm)->rank = rank;
  (*comm)->nranks = nranks;
  return mode() == ScriptedMode::kInitNeverCompletes ? ncclInProgress : ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* state) {
  switch (mode()) {
    case ScriptedMode::kInitNeverCompletes:
    case ScriptedMode::kOpsNeverComplete:
      *state = ncclInProgress;
      break;
    case ScriptedMode::kOpsFailAsynchronously:
    case ScriptedMode::kAsyncErrorWhileIdle:
      *state = ncclRemoteError;
      break;
    default:
      *state = ncclSuccess;
  }
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ++g_destroys;
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ++g_aborts;
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->nranks;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return op_result();
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return op_result();
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return op_result();
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return op_result();
}
ncclResult_t ncclSend(const void* buffer, size_t count, ncclDataType_t, int peer, ncclComm_t comm,
                      cudaStream_t) {
  std::lock_guard lock(comm->mutex);
  comm->p2p.push_back({1, peer, buffer, count});
  return op_result();
}
ncclResult_t ncclRecv(void* buffer, size_t count, ncclDataType_t, int peer, ncclComm_t comm,
                      cudaStream_t) {
  std::lock_guard lock(comm->mutex);
  comm->p2p.push_back({0, peer, buffer, count});
  return op_result();
}
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return op_result(); }

}  // extern "C"
