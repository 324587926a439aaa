// SPDX-License-Identifier: Apache-2.0
// A library that exports NCCL's required entry points (and none of the optional ones) and
// reports version TPCOMM_FAKE_NCCL_VERSION: lets the loader's version and capability checks
// be tested without installing old NCCL releases. Every other call fails.
#include <nccl.h>

#ifndef TPCOMM_FAKE_NCCL_VERSION
#error "define TPCOMM_FAKE_NCCL_VERSION, e.g. 21700 for 2.17.0"
#endif

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = TPCOMM_FAKE_NCCL_VERSION;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) { return "fake NCCL error"; }
const char* ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInternalError; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) {
  return ncclInternalError;
}
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInternalError; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInternalError; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { return ncclInternalError; }
ncclResult_t ncclCommCount(const ncclComm_t, int*) { return ncclInternalError; }
ncclResult_t ncclCommUserRank(const ncclComm_t, int*) { return ncclInternalError; }
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclInternalError;
}
ncclResult_t ncclGroupStart() { return ncclInternalError; }
ncclResult_t ncclGroupEnd() { return ncclInternalError; }

}  // extern "C"
