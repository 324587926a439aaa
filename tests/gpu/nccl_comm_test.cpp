// SPDX-License-Identifier: Apache-2.0
// NcclComm on real GPUs: world size 1 on GPU 0 (NCCL refuses two ranks on one GPU), and one
// thread per GPU where the machine has several. Data are small integers, exact in every dtype
// used, so results compare bitwise. Buffers start as 0xff bytes (NaN for floats), so an
// operation that writes nothing cannot pass.
#include "backends/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl_lib.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/options.hpp"

namespace tpcomm {
namespace {

/// `count` elements of T in device memory, filled with 0xff bytes.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0xff, bytes()), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] T* get() const { return data_; }
  [[nodiscard]] std::size_t bytes() const { return count_ * sizeof(T); }
  // cudaMemcpy runs on the legacy default stream, which the blocking streams used below
  // (cudaStreamCreate) wait for; downloads happen after NcclComm::wait.
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), count_);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  std::size_t count_;
};

/// Integers in [-100, 100], exact in fp32 and bf16.
std::vector<float> small_ints(std::size_t n, int seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + seed) % 201) - 100.0f;
  return v;
}

/// bf16 bit patterns of `values`: the upper half of the fp32 pattern, exact for integers of
/// at most 8 significant bits.
std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    bits[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(values[i]) >> 16);
  }
  return bits;
}

constexpr std::size_t kCount = 4099;  // odd: no size happens to be a multiple of anything

class NcclCommWorldOne : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    boots_ = Bootstrap::in_process(1);
    comm_ = std::make_unique<NcclComm>(boots_[0], 0, Options::from_env());
  }
  void TearDown() override {
    comm_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  std::vector<Bootstrap> boots_;
  std::unique_ptr<NcclComm> comm_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(NcclCommWorldOne, ReportsItsPlace) {
  EXPECT_EQ(comm_->rank(), 0);
  EXPECT_EQ(comm_->world_size(), 1);
  EXPECT_EQ(comm_->device(), 0);
  EXPECT_GE(comm_->version(), NcclLib::kMinVersion);
  EXPECT_EQ(comm_->version(), comm_->lib().version());
  EXPECT_TRUE(comm_->enabled());
  EXPECT_EQ(comm_->health(), Status::kOk);
  EXPECT_NE(comm_->native_handle(), nullptr);
  EXPECT_EQ(comm_->wait(stream_), Status::kOk);
}

TEST_F(NcclCommWorldOne, AllReduceInPlaceF32) {
  const auto host = small_ints(kCount, 1);
  DeviceBuffer<float> buf(kCount);
  buf.upload(host);
  ASSERT_EQ(comm_->all_reduce(buf.get(), buf.get(), kCount, DType::kF32, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(buf.download(), host);
}

TEST_F(NcclCommWorldOne, AllReduceOutOfPlaceF32) {
  const auto host = small_ints(kCount, 2);
  DeviceBuffer<float> in(kCount);
  DeviceBuffer<float> out(kCount);
  in.upload(host);
  ASSERT_EQ(comm_->all_reduce(in.get(), out.get(), kCount, DType::kF32, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(out.download(), host);
  EXPECT_EQ(in.download(), host);
}

TEST_F(NcclCommWorldOne, AllReduceBf16InPlaceAndOutOfPlace) {
  const auto bits = to_bf16_bits(small_ints(kCount, 3));
  DeviceBuffer<std::uint16_t> in(kCount);
  DeviceBuffer<std::uint16_t> out(kCount);
  in.upload(bits);
  ASSERT_EQ(comm_->all_reduce(in.get(), out.get(), kCount, DType::kBF16, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->all_reduce(in.get(), in.get(), kCount, DType::kBF16, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(out.download(), bits);
  EXPECT_EQ(in.download(), bits);
}

TEST_F(NcclCommWorldOne, EveryReduceOpIsTheIdentityOnOneRank) {
  const auto host = small_ints(kCount, 4);
  DeviceBuffer<float> in(kCount);
  in.upload(host);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
    DeviceBuffer<float> out(kCount);
    ASSERT_EQ(comm_->all_reduce(in.get(), out.get(), kCount, DType::kF32, op, stream_), Status::kOk)
        << to_string(op);
    ASSERT_EQ(comm_->wait(stream_), Status::kOk);
    EXPECT_EQ(out.download(), host) << to_string(op);
  }
}

TEST_F(NcclCommWorldOne, AllGatherReduceScatterBroadcastAllToAll) {
  const auto host = small_ints(kCount, 5);
  DeviceBuffer<float> in(kCount);
  in.upload(host);
  DeviceBuffer<float> gathered(kCount);
  DeviceBuffer<float> scattered(kCount);
  DeviceBuffer<float> broadcast(kCount);
  DeviceBuffer<float> exchanged(kCount);
  ASSERT_EQ(comm_->all_gather(in.get(), gathered.get(), kCount, DType::kF32, stream_), Status::kOk);
  ASSERT_EQ(comm_->reduce_scatter(in.get(), scattered.get(), kCount, DType::kF32, ReduceOp::kSum,
                                  stream_),
            Status::kOk);
  ASSERT_EQ(comm_->broadcast(in.get(), broadcast.get(), kCount, DType::kF32, 0, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->all_to_all(in.get(), exchanged.get(), kCount, DType::kF32, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(gathered.download(), host);
  EXPECT_EQ(scattered.download(), host);
  EXPECT_EQ(broadcast.download(), host);
  EXPECT_EQ(exchanged.download(), host);
}

TEST_F(NcclCommWorldOne, BroadcastInPlace) {
  const auto host = small_ints(kCount, 6);
  DeviceBuffer<float> buf(kCount);
  buf.upload(host);
  ASSERT_EQ(comm_->broadcast(buf.get(), buf.get(), kCount, DType::kF32, 0, stream_), Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(buf.download(), host);
}

TEST_F(NcclCommWorldOne, GroupedSendAndReceiveToSelf) {
  std::vector<std::int32_t> host(kCount);
  for (std::size_t i = 0; i < kCount; ++i) host[i] = static_cast<std::int32_t>(i) - 2000;
  DeviceBuffer<std::int32_t> in(kCount);
  DeviceBuffer<std::int32_t> out(kCount);
  in.upload(host);
  ASSERT_EQ(comm_->group_start(), Status::kOk);
  ASSERT_EQ(comm_->send(in.get(), kCount, DType::kI32, 0, stream_), Status::kOk);
  ASSERT_EQ(comm_->recv(out.get(), kCount, DType::kI32, 0, stream_), Status::kOk);
  ASSERT_EQ(comm_->group_end(), Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(out.download(), host);
}

TEST_F(NcclCommWorldOne, DisabledAnswersUnsupportedAndWritesNothing) {
  const std::vector<std::uint32_t> untouched(kCount, 0xffffffffu);
  DeviceBuffer<std::uint32_t> in(kCount);
  in.upload(std::vector<std::uint32_t>(kCount, 7));
  DeviceBuffer<std::uint32_t> out(kCount);
  comm_->set_enabled(false);
  EXPECT_FALSE(comm_->enabled());
  const auto u32 = DType::kU32;
  EXPECT_EQ(comm_->all_reduce(in.get(), out.get(), kCount, u32, ReduceOp::kSum, stream_),
            Status::kUnsupported);
  EXPECT_EQ(comm_->all_gather(in.get(), out.get(), kCount, u32, stream_), Status::kUnsupported);
  EXPECT_EQ(comm_->reduce_scatter(in.get(), out.get(), kCount, u32, ReduceOp::kSum, stream_),
            Status::kUnsupported);
  EXPECT_EQ(comm_->broadcast(in.get(), out.get(), kCount, u32, 0, stream_), Status::kUnsupported);
  EXPECT_EQ(comm_->all_to_all(in.get(), out.get(), kCount, u32, stream_), Status::kUnsupported);
  EXPECT_EQ(comm_->send(in.get(), kCount, u32, 0, stream_), Status::kUnsupported);
  EXPECT_EQ(comm_->recv(out.get(), kCount, u32, 0, stream_), Status::kUnsupported);
  EXPECT_EQ(comm_->group_start(), Status::kUnsupported);
  EXPECT_EQ(comm_->group_end(), Status::kUnsupported);
  // wait() is not an operation: it works in either state.
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(out.download(), untouched);
  EXPECT_EQ(comm_->health(), Status::kOk);

  comm_->set_enabled(true);
  ASSERT_EQ(comm_->all_reduce(in.get(), out.get(), kCount, u32, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(out.download(), std::vector<std::uint32_t>(kCount, 7));
}

TEST_F(NcclCommWorldOne, ScopeSetsAndRestoresTheState) {
  DeviceBuffer<float> buf(16);
  buf.upload(std::vector<float>(16, 1.0f));
  ASSERT_TRUE(comm_->enabled());
  {
    auto off = comm_->scope(false);
    EXPECT_FALSE(comm_->enabled());
    EXPECT_EQ(comm_->all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
              Status::kUnsupported);
    {
      auto on = comm_->scope(true);
      EXPECT_TRUE(comm_->enabled());
      EXPECT_EQ(comm_->all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
                Status::kOk);
    }
    EXPECT_FALSE(comm_->enabled());
  }
  EXPECT_TRUE(comm_->enabled());
  EXPECT_EQ(comm_->wait(stream_), Status::kOk);
}

TEST(NcclCommStartup, CanStartDisabled) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto boots = Bootstrap::in_process(1);
  NcclComm comm(boots[0], 0, Options::from_env(), /*enabled=*/false);
  EXPECT_FALSE(comm.enabled());
  DeviceBuffer<float> buf(4);
  EXPECT_EQ(comm.all_reduce(buf.get(), buf.get(), 4, DType::kF32, ReduceOp::kSum, nullptr),
            Status::kUnsupported);
  EXPECT_EQ(comm.health(), Status::kOk);
}

TEST_F(NcclCommWorldOne, InvalidArgumentsAreRefusedAndLeaveItUsable) {
  DeviceBuffer<float> buf(16);
  buf.upload(std::vector<float>(16, 2.0f));
  EXPECT_EQ(comm_->broadcast(buf.get(), buf.get(), 16, DType::kF32, /*root=*/1, stream_),
            Status::kInvalidArgument);
  EXPECT_NE(comm_->last_error().find("root 1"), std::string::npos) << comm_->last_error();
  EXPECT_EQ(comm_->send(buf.get(), 16, DType::kF32, /*peer=*/-1, stream_),
            Status::kInvalidArgument);
  EXPECT_EQ(comm_->all_reduce(nullptr, buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kInvalidArgument);
  EXPECT_EQ(comm_->health(), Status::kOk);
  ASSERT_EQ(comm_->all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(comm_->wait(stream_), Status::kOk);
  EXPECT_EQ(buf.download(), std::vector<float>(16, 2.0f));
}

TEST_F(NcclCommWorldOne, AbortIsStickyAndIdempotent) {
  DeviceBuffer<float> buf(16);
  comm_->abort();
  EXPECT_EQ(comm_->health(), Status::kAborted);
  EXPECT_EQ(comm_->native_handle(), nullptr);
  EXPECT_EQ(comm_->all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kAborted);
  EXPECT_EQ(comm_->group_start(), Status::kAborted);
  EXPECT_EQ(comm_->wait(stream_), Status::kAborted);
  // Disabled or not, an aborted communicator says so.
  comm_->set_enabled(false);
  EXPECT_EQ(comm_->all_gather(buf.get(), buf.get(), 16, DType::kF32, stream_), Status::kAborted);
  comm_->abort();
  EXPECT_EQ(comm_->health(), Status::kAborted);
}

TEST_F(NcclCommWorldOne, MovesKeepTheCommunicator) {
  NcclComm moved = std::move(*comm_);
  DeviceBuffer<float> buf(16);
  buf.upload(std::vector<float>(16, 3.0f));
  EXPECT_EQ(comm_->all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kInvalidArgument);
  ASSERT_EQ(moved.all_reduce(buf.get(), buf.get(), 16, DType::kF32, ReduceOp::kSum, stream_),
            Status::kOk);
  ASSERT_EQ(moved.wait(stream_), Status::kOk);
  EXPECT_EQ(buf.download(), std::vector<float>(16, 3.0f));
}

TEST(NcclCommStartup, MissingNcclIsUnavailable) {
  auto boots = Bootstrap::in_process(1);
  Options options = Options::from_env();
  options.nccl_path = "/nonexistent/tpcomm/libnccl.so.2";
  try {
    NcclComm comm(boots[0], 0, options);
    FAIL() << "constructed without NCCL";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kUnavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find(options.nccl_path), std::string::npos) << e.what();
  }
}

TEST(NcclCommStartup, DeviceOutOfRangeIsInvalidArgument) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  auto boots = Bootstrap::in_process(1);
  try {
    NcclComm comm(boots[0], count, Options::from_env());
    FAIL() << "constructed on device " << count << " of " << count;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kInvalidArgument) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Several GPUs: one thread per GPU, each a rank, values encoding (source rank, destination
// rank, index) so that a misplaced element names its origin.

template <class T>
std::string first_mismatch(const char* what, const std::vector<T>& got,
                           const std::vector<T>& want) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      std::ostringstream os;
      os << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return os.str();
    }
  }
  return {};
}

/// Runs every collective as rank `rank` of `world` on GPU `rank`; empty when all match.
std::string run_rank(Bootstrap& boot, int rank, int world) {
  try {
    if (cudaSetDevice(rank) != cudaSuccess) return "cudaSetDevice failed";
    cudaStream_t stream = nullptr;
    if (cudaStreamCreate(&stream) != cudaSuccess) return "cudaStreamCreate failed";
    NcclComm comm(boot, rank, Options::from_env());
    constexpr std::size_t n = 64;
    const auto w = static_cast<std::size_t>(world);
    const int prev = (rank + world - 1) % world;
    const int next = (rank + 1) % world;
    const int root = world - 1;

    std::vector<float> reduce_in(n);
    std::vector<float> reduce_want(n);
    for (std::size_t i = 0; i < n; ++i) {
      reduce_in[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7));
      reduce_want[i] = static_cast<float>(static_cast<int>(i % 7) * world * (world + 1) / 2);
    }
    std::vector<std::int32_t> gather_in(n);
    std::vector<std::int32_t> gather_want(w * n);
    std::vector<std::int32_t> bcast_want(n);
    std::vector<std::int32_t> ring_want(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto ii = static_cast<std::int32_t>(i);
      gather_in[i] = rank * 1000 + ii;
      for (int s = 0; s < world; ++s)
        gather_want[static_cast<std::size_t>(s) * n + i] = s * 1000 + ii;
      bcast_want[i] = root * 1000 + ii;
      ring_want[i] = prev * 1000 + ii;
    }
    std::vector<float> scatter_in(w * n);
    std::vector<float> scatter_want(n);
    std::vector<std::int32_t> a2a_in(w * n);
    std::vector<std::int32_t> a2a_want(w * n);
    for (int b = 0; b < world; ++b) {
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t at = static_cast<std::size_t>(b) * n + i;
        const auto ii = static_cast<std::int32_t>(i);
        scatter_in[at] = static_cast<float>(b + 10 * rank);
        // Block b of rank `rank` goes to rank b; rank `rank` receives block `rank` of rank b.
        a2a_in[at] = rank * 10000 + b * 100 + ii;
        a2a_want[at] = b * 10000 + rank * 100 + ii;
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      scatter_want[i] = static_cast<float>(world * rank + 10 * world * (world - 1) / 2);
    }

    DeviceBuffer<float> reduce_buf(n);
    DeviceBuffer<std::int32_t> gather_src(n);
    DeviceBuffer<std::int32_t> gather_dst(w * n);
    DeviceBuffer<float> scatter_src(w * n);
    DeviceBuffer<float> scatter_dst(n);
    DeviceBuffer<std::int32_t> bcast_dst(n);
    DeviceBuffer<std::int32_t> a2a_src(w * n);
    DeviceBuffer<std::int32_t> a2a_dst(w * n);
    DeviceBuffer<std::int32_t> ring_dst(n);
    reduce_buf.upload(reduce_in);
    gather_src.upload(gather_in);
    scatter_src.upload(scatter_in);
    a2a_src.upload(a2a_in);

    std::vector<Status> s;
    s.push_back(comm.all_reduce(reduce_buf.get(), reduce_buf.get(), n, DType::kF32, ReduceOp::kSum,
                                stream));
    s.push_back(comm.all_gather(gather_src.get(), gather_dst.get(), n, DType::kI32, stream));
    s.push_back(comm.reduce_scatter(scatter_src.get(), scatter_dst.get(), n, DType::kF32,
                                    ReduceOp::kSum, stream));
    // Only the root passes its input; the others pass none, as pynccl does.
    s.push_back(comm.broadcast(rank == root ? gather_src.get() : nullptr, bcast_dst.get(), n,
                               DType::kI32, root, stream));
    s.push_back(comm.all_to_all(a2a_src.get(), a2a_dst.get(), n, DType::kI32, stream));
    s.push_back(comm.group_start());
    s.push_back(comm.send(gather_src.get(), n, DType::kI32, next, stream));
    s.push_back(comm.recv(ring_dst.get(), n, DType::kI32, prev, stream));
    s.push_back(comm.group_end());
    s.push_back(comm.wait(stream));
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] != Status::kOk) {
        return "call " + std::to_string(i) + " returned " + std::string(to_string(s[i])) + ": " +
               comm.last_error();
      }
    }
    for (const std::string& m :
         {first_mismatch("all_reduce", reduce_buf.download(), reduce_want),
          first_mismatch("all_gather", gather_dst.download(), gather_want),
          first_mismatch("reduce_scatter", scatter_dst.download(), scatter_want),
          first_mismatch("broadcast", bcast_dst.download(), bcast_want),
          first_mismatch("all_to_all", a2a_dst.download(), a2a_want),
          first_mismatch("send/recv ring", ring_dst.download(), ring_want)}) {
      if (!m.empty()) return m;
    }
    cudaStreamDestroy(stream);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

TEST(NcclCommMultiGpu, EveryCollectiveAcrossTheGpus) {
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs two or more GPUs (NCCL refuses two ranks on one GPU)";
  const int world = std::min(gpus, 8);
  auto boots = Bootstrap::in_process(world, Milliseconds{120000});
  std::vector<std::string> failures(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      failures[static_cast<std::size_t>(r)] =
          run_rank(boots[static_cast<std::size_t>(r)], r, world);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(failures[static_cast<std::size_t>(r)], "") << "rank " << r << " of " << world;
  }
}

}  // namespace
}  // namespace tpcomm
