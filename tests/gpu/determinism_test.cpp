// SPDX-License-Identifier: Apache-2.0
// Batch invariance of the all-reduce (docs/DETERMINISM.md) with virtual ranks on one GPU: a few
// token rows of random 16-bit values (not integers: the order of the roundings shows), each
// placed at several positions of batches of 1 to 2048 rows among other rows, reduce to the
// host's fp32 sum in rank order rounded once, bitwise, whatever the batch, the position, the
// algorithm (each one pinned, and auto), eager or replayed from a graph, on every rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/batch_rows.hpp"

namespace tpcomm {
namespace {

using testing::algorithms;
using testing::batches_for;
using testing::Bytes;
using testing::DeviceBuffer;
using testing::invariance_options;
using testing::kFewBatches;
using testing::kMaxBatch;
using testing::kMaxBytes;
using testing::kMaxHidden;
using testing::kPlacements;
using testing::kTokens;
using testing::position;
using testing::run_ranks;
using testing::Seen;
using testing::StreamHolder;
using testing::Sweep;
using testing::Tokens;
using testing::wide;

class AllReduceInvariance : public ::testing::TestWithParam<int> {};

TEST_P(AllReduceInvariance, AllReduceRowsAreTheHostsSumInEveryBatch) {
  const int world = GetParam();
  std::vector<Tokens> cases;
  for (std::int64_t hidden : wide(world) ? std::vector<std::int64_t>{2880, 4096, 7168, 8192}
                                         : std::vector<std::int64_t>{2880, 8192})
    cases.emplace_back(world, hidden, DType::kBF16);
  cases.emplace_back(world, wide(world) ? 4096 : 2880, DType::kF16);
  Seen seen;
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    StreamHolder stream;
    const Stream s = stream.stream();
    DeviceBuffer in(kMaxBytes), out(kMaxBytes);
    for (const std::string& algo : algorithms(false)) {
      Group g(boot, 0, invariance_options(algo));
      for (const Tokens& t : cases) {
        auto view = [&](DeviceBuffer& b, std::int64_t rows) {
          return TensorView::contiguous(b.get(), t.dtype, {rows, t.hidden}, 0);
        };
        const Sweep sweep{
            g,
            boot,
            stream,
            [&](std::int64_t rows) { return g.all_reduce(view(in, rows), view(out, rows), s); },
            [&](std::int64_t rows, int p) {
              testing::fill(stream, in, t.dtype, rows * t.hidden,
                            static_cast<std::uint64_t>(rows * 4 + p), rank);
              ASSERT_EQ(kernels::poison(out.get(), rows * t.hidden * 2, s), Status::kOk);
              for (int k = 0; k < kTokens; ++k)
                if (const std::int64_t at = position(k, p, rows); at >= 0)
                  testing::put_row(stream, in, at, t.input(k, rank));
            },
            [&](std::int64_t rows, int p, const char* mode) {
              for (int k = 0; k < kTokens; ++k)
                if (const std::int64_t at = position(k, p, rows); at >= 0)
                  seen.expect_equal(
                      t.sum[static_cast<std::size_t>(k)],
                      testing::read(out.bytes_ptr() + at * t.hidden * 2, t.row_bytes()),
                      detail::concat(t.name(), ", ", algo, " (",
                                     g.backend_for_all_reduce(view(in, rows), view(out, rows)),
                                     "), token ", k, " at row ", at, " of ", rows, ", ", mode,
                                     ", rank ", rank));
            }};
        sweep.run(batches_for(world));
      }
      boot.barrier();  // no rank frees the group's buffers while a peer may read them
    }
  });
  EXPECT_EQ(seen.differences(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllReduceInvariance, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_ranks";
                         });

}  // namespace
}  // namespace tpcomm
