// SPDX-License-Identifier: Apache-2.0
// The exchanges through Group, with virtual ranks on one GPU: the LM-head exchange (custom and
// fallback), all-gather and all-to-all over peer memory, against host references, bitwise:
// every element carries random bits drawn from (seed, source rank, index), so a misplaced one
// cannot pass. Eager and graph-replayed with new data, a missing rank, bad arguments.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "support/all_reduce_cases.hpp"
#include "support/ranks.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/lm_head.hpp"

namespace tpcomm {
namespace {

using testing::DeviceBuffer;
using testing::fresh_seed;
using testing::run_ranks;
using testing::StreamHolder;

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/// The bits of element `index` of rank `rank`'s input.
std::uint64_t element(std::uint64_t seed, int rank, std::int64_t index) {
  return mix(seed ^ (static_cast<std::uint64_t>(rank) << 48) ^ static_cast<std::uint64_t>(index));
}

/// Rank `rank`'s input of `count` elements of `esize` bytes, on the host.
std::vector<unsigned char> input_of(std::uint64_t seed, int rank, std::int64_t count,
                                    std::size_t esize) {
  std::vector<unsigned char> h(static_cast<std::size_t>(count) * esize);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::uint64_t v = element(seed, rank, i);
    std::memcpy(h.data() + static_cast<std::size_t>(i) * esize, &v, esize);
  }
  return h;
}

/// Copies `host` to `dst` in order on `stream`. (A plain cudaMemcpy from pageable memory may
/// return before its copy reaches the device, and the legacy stream does not order the tests'
/// non-blocking streams.)
cudaError_t upload(void* dst, const std::vector<unsigned char>& host, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, host.data(), host.size(), cudaMemcpyHostToDevice, stream);
}

bool equals(const unsigned char* got, std::uint64_t seed, int rank, std::int64_t index,
            std::size_t esize) {
  const std::uint64_t v = element(seed, rank, index);
  return std::memcmp(got, &v, esize) == 0;
}

/// Options that pin the exchange algorithm `exchange` ("auto", "pull" or "push").
Options exchange_options(const char* exchange = "auto") {
  Options o = testing::options_for("auto");
  o.timeout_ms = 10000;
  o.exchange_algo = exchange;
  return o;
}

/// Checks `path` (what `backend_for_*` names) for a group that pins `exchange`: `prefix` +
/// "custom_ar:" + the algorithm + `suffix`, where a pinned push may also be the pull form (a call
/// the push form cannot carry). Counts the calls the push form took in `*pushed`.
void expect_path(const std::string& path, const std::string& exchange, const std::string& prefix,
                 const std::string& suffix, const std::string& what, int* pushed) {
  const std::string push = prefix + "custom_ar:push" + suffix;
  const std::string pull = prefix + "custom_ar:pull" + suffix;
  if (exchange == "push") {
    EXPECT_TRUE(path == push || path == pull) << what << ": " << path;
  } else {
    EXPECT_EQ(path, prefix + "custom_ar:" + exchange + suffix) << what;
  }
  if (path == push) ++*pushed;
}

/// Rows per rank: all `rows`, or uneven ones with rank 1 holding none (world > 2).
std::vector<std::int64_t> rows_per_rank(int world, std::int64_t rows, bool equal) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(world), rows);
  if (equal) return out;
  for (int r = 0; r < world; ++r) out[static_cast<std::size_t>(r)] = (rows * (r + 1)) % 7 + r;
  if (world > 2) out[1] = 0;
  return out;
}

/// The columns of one shard for `vocab` over `world` ranks: the vocabulary padded to a multiple
/// of 8 per shard, as engines pad it.
std::int64_t shard_cols(std::int64_t vocab, int world) {
  const std::int64_t per = (vocab + world - 1) / world;
  return (per + 7) / 8 * 8;
}

struct LmCase {
  std::int64_t vocab;
  std::int64_t rows;
  bool equal;
  DType dtype;
};

/// Elements of this rank's output that differ from the reference.
std::int64_t lm_head_wrong(const std::vector<unsigned char>& out, const LmCase& c,
                           const std::vector<std::int64_t>& rows, int world, int rank,
                           std::uint64_t seed) {
  const std::size_t esize = dtype_size(c.dtype);
  const std::int64_t cols = shard_cols(c.vocab, world);
  const std::int64_t first = std::accumulate(rows.begin(), rows.begin() + rank, std::int64_t{0});
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < rows[static_cast<std::size_t>(rank)]; ++i)
    for (std::int64_t v = 0; v < c.vocab; ++v) {
      const auto shard = static_cast<int>(v / cols);
      const std::int64_t index = (first + i) * cols + v % cols;
      wrong += equals(out.data() + static_cast<std::size_t>(i * c.vocab + v) * esize, seed, shard,
                      index, esize)
                   ? 0
                   : 1;
    }
  return wrong;
}

/// Runs every case on `world` virtual ranks: fresh inputs, poisoned output, one eager call,
/// the bitwise check. `options` pin the exchange algorithm; the path `backend_for_lm_head_exchange`
/// names is `prefix` + that algorithm + `suffix` (`expect_path`). A pinned push must take at least
/// one case.
void run_lm_head_cases(int world, const std::vector<LmCase>& cases, const Options& options,
                       const std::string& prefix, const std::string& suffix) {
  std::int64_t in_bytes = 0;
  std::int64_t out_bytes = 0;
  for (const LmCase& c : cases) {
    const auto rows = rows_per_rank(world, c.rows, c.equal);
    const std::int64_t total = std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
    const auto esize = static_cast<std::int64_t>(dtype_size(c.dtype));
    in_bytes = std::max(in_bytes, total * shard_cols(c.vocab, world) * esize);
    out_bytes = std::max(out_bytes, *std::max_element(rows.begin(), rows.end()) * c.vocab * esize);
  }
  std::vector<std::uint64_t> seeds;
  for (std::size_t i = 0; i < cases.size(); ++i) seeds.push_back(fresh_seed());
  int pushed = 0;  // by rank 0
  run_ranks(world, [&](int rank, Bootstrap& boot) {
    int mine_pushed = 0;
    Group g(boot, 0, options);
    g.prepare_exchange((in_bytes + world - 1) / world);
    StreamHolder stream;
    // Allocated once: freeing memory waits for the device, where peers' kernels may be waiting
    // for this rank.
    DeviceBuffer in(static_cast<std::size_t>(in_bytes));
    DeviceBuffer out(static_cast<std::size_t>(out_bytes));
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const LmCase& c = cases[k];
      const auto rows = rows_per_rank(world, c.rows, c.equal);
      const std::int64_t total = std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
      const std::int64_t cols = shard_cols(c.vocab, world);
      const std::int64_t mine = rows[static_cast<std::size_t>(rank)];
      const std::size_t esize = dtype_size(c.dtype);
      const auto host = input_of(seeds[k], rank, total * cols, esize);
      ASSERT_EQ(upload(in.get(), host, stream.get()), cudaSuccess);
      const std::int64_t out_size = mine * c.vocab * static_cast<std::int64_t>(esize);
      ASSERT_EQ(kernels::poison(out.get(), out_size, stream.stream()), Status::kOk);
      const auto shards = TensorView::contiguous(in.get(), c.dtype, {total, cols}, 0);
      const auto result = TensorView::contiguous(out.get(), c.dtype, {mine, c.vocab}, 0);
      const LmHeadLayout layout =
          c.equal ? LmHeadLayout::equal(c.rows) : LmHeadLayout::counts(rows);
      const std::string what =
          detail::concat("world ", world, " vocab ", c.vocab, " rows ", c.rows,
                         c.equal ? " equal " : " uneven ", to_string(c.dtype), " rank ", rank);
      expect_path(g.backend_for_lm_head_exchange(shards, result, layout), options.exchange_algo,
                  prefix, suffix, what, &mine_pushed);
      ASSERT_EQ(g.lm_head_exchange(shards, result, layout, stream.stream()), Status::kOk)
          << what << ": " << g.last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
      const auto got = testing::to_host(out.get(), static_cast<std::size_t>(out_size));
      EXPECT_EQ(lm_head_wrong(got, c, rows, world, rank, seeds[k]), 0) << what;
    }
    if (rank == 0) pushed = mine_pushed;
    boot.barrier();
  });
  if (options.exchange_algo == "push") {
    EXPECT_GT(pushed, 0) << "the push form took no case";
  }
}

std::vector<LmCase> lm_head_grid(std::initializer_list<DType> dtypes) {
  std::vector<LmCase> out;
  for (DType t : dtypes)
    for (std::int64_t vocab : {1, 1000, 32000, 129280, 151936, 152064})
      for (std::int64_t rows : {1, 3, 36, 120})
        for (bool equal : {true, false}) out.push_back({vocab, rows, equal, t});
  return out;
}

TEST(LmHeadExchange, CustomOnVirtualRanks) {
  for (int world : {2, 3, 4, 8}) {
    SCOPED_TRACE(world);
    const auto dtypes = world == 4
                            ? std::initializer_list<DType>{DType::kBF16, DType::kF16, DType::kF32}
                            : std::initializer_list<DType>{DType::kBF16};
    for (const char* exchange : {"pull", "push"})
      run_lm_head_cases(world, lm_head_grid(dtypes), exchange_options(exchange), "", "");
  }
}

TEST(LmHeadExchange, FallbackAllGatherAndCopy) {
  for (int world : {2, 3, 8}) {
    SCOPED_TRACE(world);
    std::vector<LmCase> cases;
    for (std::int64_t vocab : {1, 1000, 129280, 152064})
      for (std::int64_t rows : {1, 36})
        for (bool equal : {true, false})
          cases.push_back({vocab, rows, equal, world == 3 ? DType::kF32 : DType::kBF16});
    for (const char* exchange : {"pull", "push"}) {
      Options o = exchange_options(exchange);
      o.lm_head_a2a = Switch::kOff;
      run_lm_head_cases(world, cases, o, "all_gather:", "+copy");
    }
  }
}

// Captured once (custom in both forms and fallback, equal and per-rank rows), replayed with new
// inputs. The push form at one token a rank (uneven: up to 7 rows), where its pieces fit.
TEST(LmHeadExchange, GraphReplayWithNewInputs) {
  const int world = 4;
  for (const char* exchange : {"pull", "push", "fallback"}) {
    const bool fallback = std::string(exchange) == "fallback";
    const bool push = std::string(exchange) == "push";
    for (bool equal : {true, false}) {
      SCOPED_TRACE(detail::concat(exchange, equal ? " equal" : " uneven"));
      const LmCase c{129280, push ? 1 : 36, equal, DType::kBF16};
      const auto rows = rows_per_rank(world, c.rows, c.equal);
      const std::int64_t total = std::accumulate(rows.begin(), rows.end(), std::int64_t{0});
      const std::int64_t cols = shard_cols(c.vocab, world);
      std::vector<std::uint64_t> seeds{fresh_seed(), fresh_seed(), fresh_seed()};
      Options o = exchange_options(fallback ? "auto" : exchange);
      if (fallback) o.lm_head_a2a = Switch::kOff;
      run_ranks(world, [&](int rank, Bootstrap& boot) {
        Group g(boot, 0, o);
        g.prepare_exchange(total * cols * 2 / world + 1);
        StreamHolder stream;
        const cudaStream_t s = stream.get();
        const std::int64_t mine = rows[static_cast<std::size_t>(rank)];
        DeviceBuffer in(static_cast<std::size_t>(total * cols * 2));
        DeviceBuffer out(static_cast<std::size_t>(std::max<std::int64_t>(mine, 1) * c.vocab * 2));
        const auto shards = TensorView::contiguous(in.get(), c.dtype, {total, cols}, 0);
        const auto result = TensorView::contiguous(out.get(), c.dtype, {mine, c.vocab}, 0);
        const LmHeadLayout layout =
            c.equal ? LmHeadLayout::equal(c.rows) : LmHeadLayout::counts(rows);
        if (!fallback) {
          EXPECT_EQ(g.backend_for_lm_head_exchange(shards, result, layout),
                    std::string("custom_ar:") + exchange);
        }
        // NOTE [graphs of virtual ranks] (tune/graph_timer.hpp): every rank instantiates and
        // uploads, and fills its inputs, before any rank replays; and destroys its graph before
        // any rank goes on.
        {
          const testing::CapturedGraph graph(g, stream.stream(), [&] {
            EXPECT_EQ(g.lm_head_exchange(shards, result, layout, stream.stream()), Status::kOk)
                << g.last_error();
          });
          ASSERT_TRUE(graph.ok());
          ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          for (std::uint64_t seed : seeds) {
            const auto host = input_of(seed, rank, total * cols, 2);
            ASSERT_EQ(upload(in.get(), host, s), cudaSuccess);
            ASSERT_EQ(kernels::poison(out.get(), mine * c.vocab * 2, stream.stream()), Status::kOk);
            ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
            boot.barrier();
            ASSERT_EQ(graph.launch(), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
            ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
            const auto got =
                testing::to_host(out.get(), static_cast<std::size_t>(mine * c.vocab * 2));
            EXPECT_EQ(lm_head_wrong(got, c, rows, world, rank, seed), 0) << "rank " << rank;
            boot.barrier();  // every rank has checked before the next inputs go in
          }
        }
        boot.barrier();
      });
    }
  }
}

// All-gather and all-to-all (equal split and per-peer counts) over peer memory, in both forms:
// odd sizes, every access width (misaligned views, one-byte elements; for the push form 8, 4, 2
// and 1 bytes over whole words), in place, eager and captured.
TEST(Exchange, AllGatherAndAllToAll) {
  for (int world : {2, 3, 5, 8}) {
    for (const char* exchange : {"pull", "push"}) {
      SCOPED_TRACE(detail::concat(world, " ", exchange));
      struct Shape {
        DType dtype;
        std::int64_t count;  // per rank (all-gather) or per chunk (all-to-all)
        std::int64_t offset;
      };
      const std::vector<Shape> shapes{{DType::kBF16, 1, 0},     {DType::kBF16, 4099, 1},
                                      {DType::kF32, 65536, 0},  {DType::kU8, 777, 3},
                                      {DType::kF16, 300001, 2}, {DType::kI64, 1000, 0},
                                      {DType::kU8, 1 << 20, 0}, {DType::kBF16, 4098, 1},
                                      {DType::kU8, 4000, 3},    {DType::kF32, 1001, 1}};
      std::vector<std::uint64_t> seeds;
      for (std::size_t i = 0; i < 3 * shapes.size() * 2; ++i) seeds.push_back(fresh_seed());
      int pushed = 0;  // by rank 0
      run_ranks(world, [&](int rank, Bootstrap& boot) {
        int mine_pushed = 0;
        Group g(boot, 0, exchange_options(exchange));
        StreamHolder stream;
        const cudaStream_t s = stream.get();
        const std::size_t most = static_cast<std::size_t>(world) * (4 << 20) + 64;
        DeviceBuffer in(most);
        DeviceBuffer out(most);
        std::size_t next_seed = 0;
        for (bool captured : {false, true}) {
          for (const Shape& sh : shapes) {
            const std::size_t esize = dtype_size(sh.dtype);
            const std::int64_t n = sh.count;
            // Per-peer counts: rank s sends (s + 2 d + n) % 5 + n / 2 elements to rank d.
            std::vector<std::int64_t> counts(static_cast<std::size_t>(world * world));
            for (int a = 0; a < world; ++a)
              for (int d = 0; d < world; ++d)
                counts[static_cast<std::size_t>(a * world + d)] = (a + 2 * d + n) % 5 + n / 2;
            auto sent_by = [&](int a) {
              std::int64_t t = 0;
              for (int d = 0; d < world; ++d) t += counts[static_cast<std::size_t>(a * world + d)];
              return t;
            };
            for (int op = 0; op < 3; ++op) {  // all-gather, all-to-all, all-to-all with counts
              const std::uint64_t seed = seeds[next_seed++ % seeds.size()];
              const std::string what =
                  detail::concat(op == 0   ? "all_gather "
                                 : op == 1 ? "all_to_all "
                                           : "all_to_allv ",
                                 to_string(sh.dtype), " x", n, " +", sh.offset,
                                 captured ? " captured" : " eager", " rank ", rank);
              const std::int64_t in_count = op == 0 ? n : op == 1 ? n * world : sent_by(rank);
              std::int64_t out_count = op == 0 || op == 1 ? n * world : 0;
              if (op == 2)
                for (int a = 0; a < world; ++a)
                  out_count += counts[static_cast<std::size_t>(a * world + rank)];
              // In place for the all-gather of the captured pass: the input is this rank's block.
              const bool in_place = op == 0 && captured && sh.offset == 0;
              char* out_ptr = out.bytes_ptr() + sh.offset * esize;
              char* in_ptr = in_place ? out_ptr + static_cast<std::size_t>(rank * n) * esize
                                      : in.bytes_ptr() + sh.offset * esize;
              const auto host = input_of(seed, rank, in_count, esize);
              ASSERT_EQ(
                  kernels::poison(out.get(), static_cast<std::int64_t>(most), stream.stream()),
                  Status::kOk);
              ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
              ASSERT_EQ(upload(in_ptr, host, s), cudaSuccess);
              const auto iv = TensorView::flat(in_ptr, sh.dtype, in_count, 0);
              const auto ov = TensorView::flat(out_ptr, sh.dtype, out_count, 0);
              if (op < 2)  // (no query for per-peer counts)
                expect_path(
                    op == 0 ? g.backend_for_all_gather(iv, ov) : g.backend_for_all_to_all(iv, ov),
                    exchange, "", "", what, &mine_pushed);
              auto call = [&] {
                if (op == 0) return g.all_gather(iv, ov, stream.stream());
                if (op == 1) return g.all_to_all(iv, ov, stream.stream());
                return g.all_to_all(iv, ov, counts, stream.stream());
              };
              if (captured) {
                const testing::CapturedGraph graph(g, stream.stream(), [&] {
                  EXPECT_EQ(call(), Status::kOk) << what << ": " << g.last_error();
                });
                ASSERT_TRUE(graph.ok());
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
                boot.barrier();  // NOTE [graphs of virtual ranks]
                ASSERT_EQ(graph.launch(), cudaSuccess);
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
              } else {
                ASSERT_EQ(call(), Status::kOk) << what << ": " << g.last_error();
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
              }
              ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
              const auto got =
                  testing::to_host(out_ptr, static_cast<std::size_t>(out_count) * esize);
              std::int64_t wrong = 0;
              std::int64_t at = 0;
              for (int src = 0; src < world; ++src) {
                // Where rank src's part for this rank starts in src's input, and how long it is.
                std::int64_t from = 0;
                std::int64_t len = n;
                if (op == 1) from = rank * n;
                if (op == 2) {
                  for (int d = 0; d < rank; ++d)
                    from += counts[static_cast<std::size_t>(src * world + d)];
                  len = counts[static_cast<std::size_t>(src * world + rank)];
                }
                for (std::int64_t i = 0; i < len; ++i, ++at) {
                  if (equals(got.data() + static_cast<std::size_t>(at) * esize, seed, src, from + i,
                             esize))
                    continue;
                  if (wrong++ < 3)
                    ADD_FAILURE() << what << ": element " << at << " (from rank " << src
                                  << ", its element " << from + i << ") is wrong";
                }
              }
              EXPECT_EQ(wrong, 0) << what;
              boot.barrier();  // every rank has read its output before it is poisoned again
            }
          }
        }
        if (rank == 0) pushed = mine_pushed;
        boot.barrier();
      });
      if (std::string(exchange) == "push") {
        EXPECT_GT(pushed, 0) << "the push form took no case";
      }
    }
  }
}

// Gather to every root in both forms: the root's output against the host reference, bitwise;
// the other ranks pass no output. Odd sizes and misaligned views, in place on the root, eager
// and captured (replayed with new inputs).
TEST(Exchange, GatherToEveryRoot) {
  struct Shape {
    DType dtype;
    std::int64_t count;
    std::int64_t offset;
  };
  const Shape shapes[] = {{DType::kBF16, 1, 0},    {DType::kF32, 4096, 0},
                          {DType::kU8, 777, 3},    {DType::kI64, 1000, 0},
                          {DType::kBF16, 4098, 1}, {DType::kF16, 300001, 0}};
  for (int world : {2, 3, 5, 8}) {
    for (const char* exchange : {"pull", "push"}) {
      SCOPED_TRACE(detail::concat(world, " ", exchange));
      int pushed = 0;  // by rank 0
      // Every rank's inputs and the root's check come from the same seed per case.
      std::vector<std::uint64_t> seeds(static_cast<std::size_t>(world) * std::size(shapes) * 2);
      for (auto& seed : seeds) seed = fresh_seed();
      run_ranks(world, [&](int rank, Bootstrap& boot) {
        int mine_pushed = 0;
        std::size_t next_seed = 0;
        Group g(boot, 0, exchange_options(exchange));
        StreamHolder stream;
        const cudaStream_t s = stream.get();
        const std::size_t most = static_cast<std::size_t>(world) * (1 << 20) + 64;
        DeviceBuffer in(most);
        DeviceBuffer out(most);
        for (int root = 0; root < world; ++root) {
          for (const Shape& sh : shapes) {
            for (bool captured : {false, true}) {
              const std::size_t esize = dtype_size(sh.dtype);
              const std::int64_t n = sh.count;
              const std::uint64_t seed = seeds[next_seed++];
              const bool in_place = captured && rank == root && sh.offset == 0;
              char* out_ptr = out.bytes_ptr() + sh.offset * esize;
              char* in_ptr = in_place ? out_ptr + static_cast<std::size_t>(rank * n) * esize
                                      : in.bytes_ptr() + sh.offset * esize;
              const std::string what =
                  detail::concat("gather to ", root, " ", to_string(sh.dtype), " x", n, " +",
                                 sh.offset, captured ? " captured" : " eager", " rank ", rank);
              ASSERT_EQ(
                  kernels::poison(out.get(), static_cast<std::int64_t>(most), stream.stream()),
                  Status::kOk);
              ASSERT_EQ(upload(in_ptr, input_of(seed, rank, n, esize), s), cudaSuccess);
              const auto iv = TensorView::flat(in_ptr, sh.dtype, n, 0);
              const auto ov =
                  rank == root ? TensorView::flat(out_ptr, sh.dtype, n * world, 0) : TensorView{};
              if (!captured)
                expect_path(g.backend_for_gather(iv, ov, root), exchange, "", "", what,
                            &mine_pushed);
              if (captured) {
                const testing::CapturedGraph graph(g, stream.stream(), [&] {
                  EXPECT_EQ(g.gather(iv, ov, root, stream.stream()), Status::kOk)
                      << what << ": " << g.last_error();
                });
                ASSERT_TRUE(graph.ok());
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
                boot.barrier();  // NOTE [graphs of virtual ranks]
                ASSERT_EQ(graph.launch(), cudaSuccess);
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
              } else {
                ASSERT_EQ(g.gather(iv, ov, root, stream.stream()), Status::kOk)
                    << what << ": " << g.last_error();
                ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
              }
              ASSERT_EQ(g.health(), Status::kOk) << g.last_error();
              if (rank == root) {
                const auto got =
                    testing::to_host(out_ptr, static_cast<std::size_t>(n * world) * esize);
                std::int64_t wrong = 0;
                for (int src = 0; src < world; ++src)
                  for (std::int64_t i = 0; i < n; ++i)
                    wrong += equals(got.data() + static_cast<std::size_t>(src * n + i) * esize,
                                    seed, src, i, esize)
                                 ? 0
                                 : 1;
                EXPECT_EQ(wrong, 0) << what;
              }
              boot.barrier();  // the root has read its output before it is poisoned again
            }
          }
        }
        // A root that is not a rank: refused on every rank, naming it.
        EXPECT_EQ(g.gather(TensorView::flat(in.get(), DType::kF32, 4, 0), TensorView{}, world,
                           stream.stream()),
                  Status::kInvalidArgument);
        EXPECT_NE(g.last_error().find("root"), std::string::npos) << g.last_error();
        if (rank == 0) pushed = mine_pushed;
        boot.barrier();
      });
      if (std::string(exchange) == "push") {
        EXPECT_GT(pushed, 0) << "the push form took no case";
      }
    }
  }
}

// World size 1: the exchange is a copy of the rows into place, through the local backend or,
// with TPCOMM_ALGO=nccl, through NCCL (which runs at world size 1 on one GPU), whose
// peer-to-peer buffers `prepare_exchange` sets up with a warm-up all-to-all.
TEST(LmHeadExchange, WorldSizeOneLocallyAndThroughNccl) {
  for (const char* algo : {"auto", "nccl"}) {
    SCOPED_TRACE(algo);
    run_ranks(1, [&](int, Bootstrap& boot) {
      Options o = exchange_options();
      o.algo = algo;
      std::unique_ptr<Group> g;
      try {
        g = std::make_unique<Group>(boot, 0, o);
        g->prepare_exchange(std::int64_t{1} << 20);
      } catch (const Error& e) {
        if (std::string(algo) == "nccl") GTEST_SKIP() << "no NCCL here: " << e.what();
        throw;
      }
      StreamHolder stream;
      const LmCase c{1000, 5, true, DType::kBF16};
      const std::int64_t cols = shard_cols(c.vocab, 1);
      DeviceBuffer in(static_cast<std::size_t>(c.rows * cols * 2));
      DeviceBuffer out(static_cast<std::size_t>(c.rows * c.vocab * 2));
      const std::uint64_t seed = fresh_seed();
      ASSERT_EQ(upload(in.get(), input_of(seed, 0, c.rows * cols, 2), stream.get()), cudaSuccess);
      ASSERT_EQ(kernels::poison(out.get(), c.rows * c.vocab * 2, stream.stream()), Status::kOk);
      const auto shards = TensorView::contiguous(in.get(), c.dtype, {c.rows, cols}, 0);
      const auto result = TensorView::contiguous(out.get(), c.dtype, {c.rows, c.vocab}, 0);
      EXPECT_EQ(g->backend_for_lm_head_exchange(shards, result, LmHeadLayout::equal(c.rows)),
                std::string(algo) == "nccl" ? "all_gather:nccl+copy" : "all_gather:local+copy");
      ASSERT_EQ(g->lm_head_exchange(shards, result, LmHeadLayout::equal(c.rows), stream.stream()),
                Status::kOk)
          << g->last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      const auto got = testing::to_host(out.get(), static_cast<std::size_t>(c.rows * c.vocab * 2));
      EXPECT_EQ(lm_head_wrong(got, c, rows_per_rank(1, c.rows, true), 1, 0, seed), 0);
      // An all-to-all with per-peer counts, to itself: its 7 elements land at the output's start.
      const std::int64_t counts[] = {7};
      ASSERT_EQ(
          g->all_to_all(TensorView::flat(in.get(), DType::kBF16, 7, 0),
                        TensorView::flat(out.get(), DType::kBF16, 7, 0), counts, stream.stream()),
          Status::kOk)
          << g->last_error();
      ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
      const auto seven = testing::to_host(out.get(), 14);
      for (std::int64_t i = 0; i < 7; ++i)
        EXPECT_TRUE(equals(seven.data() + i * 2, seed, 0, i, 2)) << "element " << i;
    });
  }
}

// A rank that never arrives: the others time out naming it, within the deadline, in either form
// (the push form's 8 x 2 KiB pieces fit its slots).
TEST(LmHeadExchange, MissingRankTimesOut) {
  const int world = 4;
  for (const char* exchange : {"pull", "push"})
    run_ranks(world, [&](int rank, Bootstrap& boot) {
      SCOPED_TRACE(exchange);
      Options o = exchange_options(exchange);
      o.timeout_ms = 500;
      Group g(boot, 0, o);
      StreamHolder stream;
      DeviceBuffer in(4 * 8 * 1024 * 2);
      DeviceBuffer out(8 * 4096 * 2);
      const auto shards = TensorView::contiguous(in.get(), DType::kBF16, {32, 1024}, 0);
      const auto result = TensorView::contiguous(out.get(), DType::kBF16, {8, 4096}, 0);
      ASSERT_EQ(g.warm_up(stream.stream()), Status::kOk) << g.last_error();
      EXPECT_EQ(g.backend_for_lm_head_exchange(shards, result, LmHeadLayout::equal(8)),
                std::string("custom_ar:") + exchange);
      if (rank != 0) {
        ASSERT_EQ(g.lm_head_exchange(shards, result, LmHeadLayout::equal(8), stream.stream()),
                  Status::kOk);
        ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
        EXPECT_EQ(g.health(), Status::kTimeout);
        EXPECT_NE(g.last_error().find("timed out waiting for rank 0"), std::string::npos)
            << g.last_error();
        // The group is unusable from then on, with the same report.
        EXPECT_EQ(g.lm_head_exchange(shards, result, LmHeadLayout::equal(8), stream.stream()),
                  Status::kTimeout);
      }
      boot.barrier();
    });
}

TEST(LmHeadExchange, BadArguments) {
  run_ranks(2, [&](int rank, Bootstrap& boot) {
    Group g(boot, 0, exchange_options());
    StreamHolder stream;
    DeviceBuffer in(64 * 1024 * 4);
    DeviceBuffer out(64 * 1024 * 4);
    auto t = [&](void* p, DType d, std::initializer_list<std::int64_t> shape) {
      return TensorView::contiguous(p, d, shape, 0);
    };
    const std::int64_t both[] = {3, 5};
    const std::int64_t three[] = {3, 5, 1};
    const std::int64_t negative[] = {-1, 9};
    struct Bad {
      TensorView shards, out;
      LmHeadLayout layout;
      const char* says;
    };
    const std::vector<Bad> bad{
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kF16, {4, 200}),
         LmHeadLayout::equal(4), "out is"},
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kBF16, {4, 201}),
         LmHeadLayout::equal(4), "201 columns"},
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kBF16, {4, 200}),
         LmHeadLayout::equal(3), "8 rows"},
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kBF16, {rank == 0 ? 3 : 5, 200}),
         LmHeadLayout::counts(three), "3 per-rank counts"},
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kBF16, {3, 200}),
         LmHeadLayout::counts(negative), "-1 rows"},
        {t(in.get(), DType::kBF16, {8, 100}), t(out.get(), DType::kBF16, {rank == 0 ? 5 : 3, 200}),
         LmHeadLayout::counts(both), "holds"},
        {t(in.get(), DType::kBF16, {800}), t(out.get(), DType::kBF16, {4, 200}),
         LmHeadLayout::equal(4), "2-d"},
        {t(in.get(), DType::kBF16, {8, 100}), t(in.get(), DType::kBF16, {4, 200}),
         LmHeadLayout::equal(4), "overlap"},
    };
    for (const Bad& b : bad) {
      EXPECT_EQ(g.lm_head_exchange(b.shards, b.out, b.layout, stream.stream()),
                Status::kInvalidArgument)
          << b.says;
      EXPECT_NE(g.last_error().find(b.says), std::string::npos) << g.last_error();
      EXPECT_EQ(g.health(), Status::kOk);
    }
    const std::int64_t short_counts[] = {1, 2, 3};
    const auto flat = TensorView::flat(in.get(), DType::kBF16, 8, 0);
    EXPECT_EQ(g.all_to_all(flat, TensorView::flat(out.get(), DType::kBF16, 8, 0), short_counts,
                           stream.stream()),
              Status::kInvalidArgument);
    EXPECT_NE(g.last_error().find("expected 2 x 2"), std::string::npos) << g.last_error();
    // Nothing to move anywhere: done at once, on every rank alike.
    const std::int64_t zeros[] = {0, 0, 0, 0};
    const auto none = TensorView::flat(in.get(), DType::kBF16, 0, 0);
    const auto none_out = TensorView::flat(out.get(), DType::kBF16, 0, 0);
    EXPECT_EQ(g.all_to_all(none, none_out, zeros, stream.stream()), Status::kOk) << g.last_error();
    EXPECT_EQ(g.all_gather(none, none_out, stream.stream()), Status::kOk) << g.last_error();
    EXPECT_EQ(g.all_to_all(none, none_out, stream.stream()), Status::kOk) << g.last_error();
    boot.barrier();
  });
}

}  // namespace
}  // namespace tpcomm
