// SPDX-License-Identifier: Apache-2.0
// ParallelGroups on virtual ranks: SGLang's layouts become groups, aliasing is by identity,
// and the groups run independently.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/ranks.hpp"
#include "tpcomm/parallel_groups.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::run_ranks;
using testing::StreamHolder;

TEST(ParallelGroups, MoeGroupsFromOneWorld) {
  run_ranks(4, [&](int rank, Bootstrap& world) {
    ParallelConfig c;
    c.tp_size = 4;
    c.moe_ep_size = 2;  // moe_tp = 2: EP groups {0,2},{1,3}; MoE-TP groups {0,1},{2,3}
    Options o;
    o.timeout_ms = 10000;
    ParallelGroups pg(world, 0, c, o);
    EXPECT_EQ(&pg.attn_tp(), &pg.tp());
    EXPECT_NE(&pg.moe_ep(), &pg.tp());
    EXPECT_NE(&pg.moe_tp(), &pg.tp());
    EXPECT_EQ(pg.tp().world_size(), 4);
    EXPECT_EQ(pg.tp().rank(), rank);
    EXPECT_EQ(pg.moe_ep().world_size(), 2);
    EXPECT_EQ(pg.moe_ep().rank(), rank / 2);
    EXPECT_EQ(pg.moe_tp().world_size(), 2);
    EXPECT_EQ(pg.moe_tp().rank(), rank % 2);

    // TP carries the attention fusion workspace and EP the MoE one (moe_ep > 1), so both have
    // the custom backend. MoE TP carries none and gets NCCL only, which refuses ranks sharing a
    // GPU: here nothing serves it, and it says so.
    StreamHolder stream;
    DeviceBuffer buf(4096), wrong(8);
    auto v = TensorView::flat(buf.get(), DType::kBF16, 1024, 0);
    EXPECT_EQ(pg.tp().backend_for_all_reduce(v, v), "custom_ar:lamport");
    EXPECT_EQ(pg.moe_ep().backend_for_all_reduce(v, v), "custom_ar:lamport");
    EXPECT_EQ(pg.moe_tp().backend_for_all_reduce(v, v), "none");
    for (Group* g : {&pg.tp(), &pg.moe_ep()}) {
      SCOPED_TRACE(g == &pg.tp() ? "tp" : "moe_ep");
      ASSERT_EQ(kernels::fill_data(buf.get(), DType::kBF16, 1024, 11, g->rank(), ReduceOp::kSum, 0,
                                   stream.stream()),
                Status::kOk);
      ASSERT_EQ(g->all_reduce(v, v, stream.stream()), Status::kOk) << g->last_error();
      ASSERT_EQ(cudaMemsetAsync(wrong.get(), 0, 8, stream.get()), cudaSuccess);
      ASSERT_EQ(kernels::check_data(buf.get(), DType::kBF16, 1024, 11, g->rank(), g->world_size(),
                                    ReduceOp::kSum, kernels::Collective::kAllReduce, 0,
                                    static_cast<unsigned long long*>(wrong.get()), stream.stream()),
                Status::kOk);
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      unsigned long long bad = 1;
      cudaMemcpy(&bad, wrong.get(), 8, cudaMemcpyDeviceToHost);
      EXPECT_EQ(bad, 0u);
    }
    EXPECT_EQ(pg.moe_tp().all_reduce(v, v, stream.stream()), Status::kUnsupported);
  });
}

TEST(ParallelGroups, DpAttentionMakesSingleRankAttentionGroups) {
  run_ranks(4, [&](int, Bootstrap& world) {
    ParallelConfig c;
    c.tp_size = 4;
    c.dp_size = 4;
    c.enable_dp_attention = true;  // attn_tp = 1
    ParallelGroups pg(world, 0, c, Options{});
    EXPECT_EQ(pg.attn_tp().world_size(), 1);
    StreamHolder stream;
    DeviceBuffer a(256), b(256);
    auto in = TensorView::flat(a.get(), DType::kF32, 64, 0);
    auto out = TensorView::flat(b.get(), DType::kF32, 64, 0);
    EXPECT_EQ(pg.attn_tp().backend_for_all_reduce(in, out), "local");
    EXPECT_EQ(pg.attn_tp().all_reduce(in, out, stream.stream()), Status::kOk);
    EXPECT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  });
}

}  // namespace
}  // namespace tpcomm
