// SPDX-License-Identifier: Apache-2.0
// How tests drive the scripted NCCL (tests/support/scripted_nccl.cpp): its modes and the
// functions it exports besides NCCL's. The library defines the functions; a test opens the
// library with dlopen and looks them up by name, using these declarations for their types.
#pragma once

#include <cstddef>

/// NCCL's communicator type, without <nccl.h>: `ncclComm_t` is `ncclComm*`.
struct ncclComm;

namespace tpcomm::test {

/// How the scripted NCCL answers, set with `tpcomm_scripted_nccl_set_mode`.
enum class ScriptedMode : int {
  kHealthy = 0,
  /// ncclCommInitRankConfig stays in progress forever.
  kInitNeverCompletes = 1,
  /// Operations return "in progress", then the communicator reports ncclRemoteError.
  kOpsFailAsynchronously = 2,
  /// Operations stay in progress forever.
  kOpsNeverComplete = 3,
  /// Operations return ncclInvalidArgument.
  kOpsInvalidArgument = 4,
  /// Operations succeed; the communicator reports ncclRemoteError asynchronously.
  kAsyncErrorWhileIdle = 5,
};

}  // namespace tpcomm::test

extern "C" {

/// Sets how calls answer from now on: a `ScriptedMode`, as an int.
void tpcomm_scripted_nccl_set_mode(int mode);
/// How many communicators were aborted so far.
int tpcomm_scripted_nccl_aborts();
/// How many communicators were destroyed so far.
int tpcomm_scripted_nccl_destroys();
/// The `index`-th send or receive `comm` received; 0 when there is none.
int tpcomm_scripted_nccl_p2p(ncclComm* comm, int index, int* is_send, int* peer,
                             const void** buffer, std::size_t* count);

}  // extern "C"
