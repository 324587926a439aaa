// SPDX-License-Identifier: Apache-2.0
// NcclComm's failure paths, driven by a scripted NCCL (tests/support/scripted_nccl.cpp) that
// moves no data: timeouts, asynchronous errors, sticky aborts, graceful destruction, and the
// grouped send/receive all-to-all used when the loaded NCCL has no ncclAlltoAll. A GPU is
// needed only for the CUDA runtime calls NcclComm makes around NCCL (device checks, the
// warm-up's stream and buffer, stream queries in wait()).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "support/run_program.hpp"
#include "support/scripted.hpp"

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <mutex>

#include "backends/nccl_comm.hpp"
#include "backends/nccl_lib.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm {
namespace {

using test::ScriptedMode;

/// The scripted library, opened a second time: dlopen returns the handle NcclLib holds.
class Script {
 public:
  Script()
      : handle_(dlopen(test::built_file(TPCOMM_SCRIPTED_NCCL).c_str(), RTLD_NOW | RTLD_LOCAL)) {}
  ~Script() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Script(const Script&) = delete;
  Script& operator=(const Script&) = delete;

  [[nodiscard]] bool loaded() const { return handle_ != nullptr; }
  void set_mode(ScriptedMode m) const {
    fn<decltype(&tpcomm_scripted_nccl_set_mode)>("tpcomm_scripted_nccl_set_mode")(
        static_cast<int>(m));
  }
  [[nodiscard]] int aborts() const {
    return fn<decltype(&tpcomm_scripted_nccl_aborts)>("tpcomm_scripted_nccl_aborts")();
  }
  [[nodiscard]] int destroys() const {
    return fn<decltype(&tpcomm_scripted_nccl_destroys)>("tpcomm_scripted_nccl_destroys")();
  }

  struct P2P {
    bool is_send;
    int peer;
    const void* buffer;
    std::size_t count;
  };
  /// Every send and receive `comm` received, in order.
  [[nodiscard]] std::vector<P2P> p2p(ncclComm* comm) const {
    auto get = fn<decltype(&tpcomm_scripted_nccl_p2p)>("tpcomm_scripted_nccl_p2p");
    std::vector<P2P> calls;
    int is_send = 0;
    int peer = 0;
    const void* buffer = nullptr;
    std::size_t count = 0;
    for (int i = 0; get(comm, i, &is_send, &peer, &buffer, &count) != 0; ++i) {
      calls.push_back({is_send != 0, peer, buffer, count});
    }
    return calls;
  }

 private:
  template <class F>
  F fn(const char* name) const {
    return reinterpret_cast<F>(dlsym(handle_, name));
  }
  void* handle_;
};

constexpr std::int64_t kTimeoutMs = 200;

Options scripted_options() {
  Options o;
  o.nccl_path = test::built_file(TPCOMM_SCRIPTED_NCCL);
  o.timeout_ms = kTimeoutMs;
  return o;
}

void CUDART_CB sleep_milliseconds(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(ms)));
}

/// Keeps `stream` busy for `ms` milliseconds (a host function sleeps in it).
void occupy(cudaStream_t stream, std::intptr_t ms) {
  ASSERT_EQ(cudaLaunchHostFunc(stream, sleep_milliseconds, reinterpret_cast<void*>(ms)),
            cudaSuccess);
}

class NcclCommFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(script_.loaded()) << dlerror();
    script_.set_mode(ScriptedMode::kHealthy);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    boots_ = Bootstrap::in_process(1);
  }
  void TearDown() override {
    script_.set_mode(ScriptedMode::kHealthy);
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  Script script_;
  std::vector<Bootstrap> boots_;
  cudaStream_t stream_ = nullptr;
  float dummy_[16] = {};  // the scripted NCCL never touches buffers
};

TEST_F(NcclCommFailures, TheScriptedLibraryLoadsWithoutAllToAll) {
  const NcclLib& lib = NcclLib::load(test::built_file(TPCOMM_SCRIPTED_NCCL));
  EXPECT_EQ(lib.version_string(), "2.28.9");
  EXPECT_TRUE(lib.has_comm_finalize);
  EXPECT_FALSE(lib.has_all_to_all);
}

TEST_F(NcclCommFailures, HealthyCommunicatorIsDestroyedNotAborted) {
  const int aborts = script_.aborts();
  const int destroys = script_.destroys();
  {
    NcclComm comm(boots_[0], 0, scripted_options());
    EXPECT_EQ(comm.health(), Status::kOk);
  }
  EXPECT_EQ(script_.destroys(), destroys + 1);
  EXPECT_EQ(script_.aborts(), aborts);
}

TEST_F(NcclCommFailures, InitThatNeverCompletesTimesOutAndAborts) {
  script_.set_mode(ScriptedMode::kInitNeverCompletes);
  const int aborts = script_.aborts();
  const auto start = std::chrono::steady_clock::now();
  try {
    NcclComm comm(boots_[0], 0, scripted_options());
    FAIL() << "constructed although NCCL never finished initialising";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not finish within 200 ms"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(script_.aborts(), aborts + 1);
}

TEST_F(NcclCommFailures, AsynchronousErrorAbortsAndSticks) {
  NcclComm comm(boots_[0], 0, scripted_options());
  const int aborts = script_.aborts();
  const int destroys = script_.destroys();
  script_.set_mode(ScriptedMode::kOpsFailAsynchronously);
  EXPECT_EQ(comm.all_reduce(dummy_, dummy_, 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kNcclError);
  EXPECT_EQ(comm.health(), Status::kNcclError);
  EXPECT_NE(comm.last_error().find("ncclRemoteError"), std::string::npos) << comm.last_error();
  EXPECT_NE(comm.last_error().find("scripted last error"), std::string::npos) << comm.last_error();
  EXPECT_EQ(script_.aborts(), aborts + 1);
  script_.set_mode(ScriptedMode::kHealthy);
  EXPECT_EQ(comm.all_reduce(dummy_, dummy_, 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kAborted);
  EXPECT_EQ(comm.wait(stream_), Status::kAborted);
  EXPECT_EQ(comm.native_handle(), nullptr);
  // Nothing left to destroy.
  EXPECT_EQ(script_.destroys(), destroys);
}

TEST_F(NcclCommFailures, OperationStuckInProgressTimesOut) {
  NcclComm comm(boots_[0], 0, scripted_options());
  script_.set_mode(ScriptedMode::kOpsNeverComplete);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(comm.all_gather(dummy_, dummy_, 4, DType::kF32, stream_), Status::kTimeout);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, std::chrono::milliseconds(kTimeoutMs));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  EXPECT_EQ(comm.health(), Status::kTimeout);
  EXPECT_EQ(comm.broadcast(dummy_, dummy_, 4, DType::kF32, 0, stream_), Status::kAborted);
}

TEST_F(NcclCommFailures, InvalidArgumentLeavesItUsable) {
  const int aborts = script_.aborts();
  const int destroys = script_.destroys();
  {
    NcclComm comm(boots_[0], 0, scripted_options());
    script_.set_mode(ScriptedMode::kOpsInvalidArgument);
    EXPECT_EQ(comm.reduce_scatter(dummy_, dummy_, 4, DType::kF32, ReduceOp::kMax, stream_),
              Status::kInvalidArgument);
    EXPECT_NE(comm.last_error().find("ncclInvalidArgument"), std::string::npos)
        << comm.last_error();
    EXPECT_EQ(comm.health(), Status::kOk);
    script_.set_mode(ScriptedMode::kHealthy);
    EXPECT_EQ(comm.reduce_scatter(dummy_, dummy_, 4, DType::kF32, ReduceOp::kMax, stream_),
              Status::kOk);
  }
  EXPECT_EQ(script_.aborts(), aborts);
  EXPECT_EQ(script_.destroys(), destroys + 1);
}

TEST_F(NcclCommFailures, WaitReportsAnAsynchronousErrorAndAborts) {
  NcclComm comm(boots_[0], 0, scripted_options());
  const int aborts = script_.aborts();
  ASSERT_NO_FATAL_FAILURE(occupy(stream_, 500));
  script_.set_mode(ScriptedMode::kAsyncErrorWhileIdle);
  EXPECT_EQ(comm.wait(stream_, Milliseconds{10000}), Status::kNcclError);
  EXPECT_EQ(comm.health(), Status::kNcclError);
  EXPECT_NE(comm.last_error().find("ncclRemoteError"), std::string::npos) << comm.last_error();
  EXPECT_EQ(script_.aborts(), aborts + 1);
}

TEST_F(NcclCommFailures, WaitTimesOutAndAborts) {
  NcclComm comm(boots_[0], 0, scripted_options());
  const int aborts = script_.aborts();
  ASSERT_NO_FATAL_FAILURE(occupy(stream_, 1000));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(comm.wait(stream_, Milliseconds{50}), Status::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(900));
  EXPECT_EQ(comm.health(), Status::kTimeout);
  EXPECT_EQ(script_.aborts(), aborts + 1);
  EXPECT_EQ(comm.all_reduce(dummy_, dummy_, 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kAborted);
}

TEST_F(NcclCommFailures, DestructionAfterAbortDoesNotDestroyAgain) {
  const int aborts = script_.aborts();
  const int destroys = script_.destroys();
  {
    NcclComm comm(boots_[0], 0, scripted_options());
    comm.abort();
    comm.abort();
  }
  EXPECT_EQ(script_.aborts(), aborts + 1);
  EXPECT_EQ(script_.destroys(), destroys);
}

// Without ncclAlltoAll, block p of `in` is sent to rank p and block p of `out` receives from
// rank p, peers in ascending order, one send and one receive each, inside one group.
constexpr int kFallbackWorld = 4;
constexpr std::size_t kPerPeer = 10;

/// Rank `rank`'s part of the test; the problems found, none when all is well.
std::vector<std::string> check_all_to_all_fallback(const Script& script, Bootstrap& boot) {
  std::vector<std::string> problems;
  try {
    if (cudaSetDevice(0) != cudaSuccess) return {"cudaSetDevice failed"};
    // Every rank on GPU 0 is fine here: the scripted NCCL is not NCCL.
    NcclComm comm(boot, 0, scripted_options());
    std::vector<std::int32_t> in(kFallbackWorld * kPerPeer);
    std::vector<std::int32_t> out(kFallbackWorld * kPerPeer);
    if (comm.all_to_all(in.data(), out.data(), kPerPeer, DType::kI32, nullptr) != Status::kOk) {
      return {"all_to_all: " + comm.last_error()};
    }
    const auto calls = script.p2p(comm.native_handle());
    if (calls.size() != 2 * kFallbackWorld) {
      return {"expected one send and one receive per peer, got " + std::to_string(calls.size()) +
              " calls"};
    }
    for (int p = 0; p < kFallbackWorld; ++p) {
      const auto& send = calls[2 * static_cast<std::size_t>(p)];
      const auto& recv = calls[2 * static_cast<std::size_t>(p) + 1];
      const std::size_t offset = static_cast<std::size_t>(p) * kPerPeer;
      if (!send.is_send || send.peer != p || send.buffer != in.data() + offset ||
          send.count != kPerPeer) {
        problems.push_back("call " + std::to_string(2 * p) + " is not the send of block " +
                           std::to_string(p));
      }
      if (recv.is_send || recv.peer != p || recv.buffer != out.data() + offset ||
          recv.count != kPerPeer) {
        problems.push_back("call " + std::to_string(2 * p + 1) + " is not the receive of block " +
                           std::to_string(p));
      }
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
  return problems;
}

TEST(NcclCommAllToAllFallback, SendsAndReceivesEveryBlockInRankOrder) {
  Script script;
  ASSERT_TRUE(script.loaded()) << dlerror();
  script.set_mode(ScriptedMode::kHealthy);
  auto boots = Bootstrap::in_process(kFallbackWorld);
  std::vector<std::vector<std::string>> problems(kFallbackWorld);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < kFallbackWorld; ++r) {
    threads.emplace_back([&, r] { problems[r] = check_all_to_all_fallback(script, boots[r]); });
  }
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < kFallbackWorld; ++r) {
    EXPECT_TRUE(problems[r].empty())
        << "rank " << r << ": " << ::testing::PrintToString(problems[r]);
  }
}

// NCCL under the group's watchdog (NOTE [nccl from two threads] in backends/nccl_comm.cpp): a
// group at world size 1 with TPCOMM_ALGO=nccl drives the scripted NCCL. An asynchronous NCCL
// error while the caller does nothing, and eager NCCL work that never finishes (the stream held
// by a host function), are each noticed by the watchdog within the deadline and its period: NCCL
// is aborted, the callback mode calls back, the raise mode fails the group's next call, and
// nothing waits for the stream.
class GroupOverScriptedNccl : public NcclCommFailures {
 protected:
  struct Seen {
    std::mutex m;
    int calls = 0;
    Status status = Status::kOk;
    std::string message;
  };

  /// A group over the scripted NCCL whose watchdog acts by `mode`; in the callback mode its
  /// handler records what it is told in `seen`.
  std::unique_ptr<Group> make_group(FailureMode mode, Seen* seen = nullptr) {
    Options o = scripted_options();
    o.algo = "nccl";
    o.failure_mode = mode;
    auto g = std::make_unique<Group>(boots_[0], 0, o);
    if (mode == FailureMode::kCallback && seen != nullptr)
      g->set_failure_mode(mode, [seen](Status s, const std::string& message) {
        std::lock_guard lock(seen->m);
        ++seen->calls;
        seen->status = s;
        seen->message = message;
      });
    return g;
  }

  /// Whether the handler was called within a second.
  static bool called_back(Seen& seen) {
    return wait_for(
               [&] {
                 std::lock_guard lock(seen.m);
                 return seen.calls > 0;
               },
               std::chrono::milliseconds(1000)) >= 0;
  }

  /// One eager all-reduce on the group; the scripted NCCL enqueues nothing.
  Status all_reduce(Group& g) {
    const auto x = TensorView::flat(buffer_, DType::kF32, 16, 0);
    return g.all_reduce(x, x, reinterpret_cast<Stream>(stream_));
  }

  /// Waits up to `limit` for `done`; the seconds it took, or a negative number.
  template <class Done>
  static double wait_for(Done&& done, std::chrono::milliseconds limit) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < limit) {
      if (done())
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return -1;
  }

  void SetUp() override {
    NcclCommFailures::SetUp();
    ASSERT_EQ(cudaMalloc(&buffer_, 64), cudaSuccess);
  }
  void TearDown() override {
    NcclCommFailures::TearDown();
    cudaFree(buffer_);
  }

  void* buffer_ = nullptr;
};

TEST_F(GroupOverScriptedNccl, TheWatchdogActsOnAnAsynchronousNcclError) {
  for (FailureMode mode : {FailureMode::kRaise, FailureMode::kCallback}) {
    SCOPED_TRACE(mode == FailureMode::kRaise ? "raise" : "callback");
    script_.set_mode(ScriptedMode::kHealthy);
    Seen seen;
    auto g = make_group(mode, &seen);
    ASSERT_EQ(g->backend_for_all_reduce(TensorView::flat(buffer_, DType::kF32, 16, 0),
                                        TensorView::flat(buffer_, DType::kF32, 16, 0)),
              "nccl");
    ASSERT_EQ(all_reduce(*g), Status::kOk) << g->last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const int aborts = script_.aborts();
    script_.set_mode(ScriptedMode::kAsyncErrorWhileIdle);
    // Nobody calls: the watchdog polls NCCL's error and aborts the communicator.
    const double took =
        wait_for([&] { return script_.aborts() > aborts; }, std::chrono::milliseconds(2000));
    EXPECT_GE(took, 0.0) << "NCCL was not aborted";
    EXPECT_LT(took, 0.5);
    if (mode == FailureMode::kCallback) {
      EXPECT_TRUE(called_back(seen));
      std::lock_guard lock(seen.m);
      EXPECT_EQ(seen.calls, 1);
      EXPECT_EQ(seen.status, Status::kNcclError);
      EXPECT_NE(seen.message.find("ncclRemoteError"), std::string::npos) << seen.message;
    }
    EXPECT_EQ(all_reduce(*g), Status::kNcclError) << g->last_error();
    EXPECT_NE(g->last_error().find("asynchronous NCCL error"), std::string::npos)
        << g->last_error();
    script_.set_mode(ScriptedMode::kHealthy);
  }
}

TEST_F(GroupOverScriptedNccl, TheWatchdogAbortsNcclWorkPastTheDeadline) {
  for (FailureMode mode : {FailureMode::kRaise, FailureMode::kCallback}) {
    SCOPED_TRACE(mode == FailureMode::kRaise ? "raise" : "callback");
    Seen seen;
    auto g = make_group(mode, &seen);
    const int aborts = script_.aborts();
    // The stream is held for 1.5 s: the call's work cannot finish within the 200 ms deadline.
    occupy(stream_, 1500);
    ASSERT_EQ(all_reduce(*g), Status::kOk) << g->last_error();
    const double took =
        wait_for([&] { return script_.aborts() > aborts; }, std::chrono::milliseconds(1200));
    EXPECT_GE(took, kTimeoutMs / 1000.0 - 0.01) << "aborted before the deadline";
    EXPECT_LT(took, kTimeoutMs / 1000.0 + 0.3) << "not aborted within the deadline";
    if (mode == FailureMode::kCallback) {
      EXPECT_TRUE(called_back(seen));
      std::lock_guard lock(seen.m);
      EXPECT_EQ(seen.status, Status::kTimeout);
      EXPECT_NE(seen.message.find("has not finished"), std::string::npos) << seen.message;
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(g->health(), Status::kTimeout) << g->last_error();
    // The call's output, unfinished when NCCL was aborted, was poisoned behind it (NaN).
    float host[16] = {};
    ASSERT_EQ(cudaMemcpy(host, buffer_, sizeof(host), cudaMemcpyDeviceToHost), cudaSuccess);
    for (float v : host) EXPECT_TRUE(std::isnan(v));
  }
}

// Teardown: an asynchronous NCCL error takes the process down though nobody calls.
TEST_F(GroupOverScriptedNccl, TeardownTakesTheProcessDownOnAnNcclError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto g = make_group(FailureMode::kTeardown);
        if (all_reduce(*g) != Status::kOk) std::exit(1);
        script_.set_mode(ScriptedMode::kAsyncErrorWhileIdle);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGABRT), "taking the process down");
}

// Teardown: eager NCCL work that does not finish within the deadline takes the process down.
TEST_F(GroupOverScriptedNccl, TeardownTakesTheProcessDownOnUnfinishedNcclWork) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto g = make_group(FailureMode::kTeardown);
        occupy(stream_, 3000);
        if (all_reduce(*g) != Status::kOk) std::exit(1);
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGABRT), "has not finished");
}

}  // namespace
}  // namespace tpcomm
