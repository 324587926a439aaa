// SPDX-License-Identifier: Apache-2.0
// The exchange's push form, its data path run on the host: the functions the kernel runs to lay
// a region out in lines and take it back (kernels/common/lines.hpp), for every plan kind, world
// sizes 2 to 8 and each rank's own access width (8, 4, 2 or 1 bytes, from misaligned views),
// against a row-by-row copy of the plans' regions. What this cannot show (the flags, the
// buffers' rotation, timing) is the gpu tier's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/exchange_plan.hpp"
#include "kernels/common/lines.hpp"

namespace tpcomm {
namespace {

using kernels::CopyRegion;
using kernels::Line;
using kernels::Lines;

/// `f.template operator()<A>()` for an access width of 8, 4, 2 or 1 bytes.
template <class F>
void with_access(int a, F&& f) {
  switch (a) {
    case 8:
      return f.template operator()<8>();
    case 4:
      return f.template operator()<4>();
    case 2:
      return f.template operator()<2>();
    default:
      return f.template operator()<1>();
  }
}

/// One past the last byte a region touches on its source or destination side.
std::int64_t extent(const CopyRegion& c, bool source) {
  if (c.rows <= 0 || c.row_bytes <= 0) return 0;
  return (source ? c.src_offset + (c.rows - 1) * c.src_pitch
                 : c.dst_offset + (c.rows - 1) * c.dst_pitch) +
         c.row_bytes;
}

struct Rank {
  ExchangePlan plan;
  std::vector<char> in_storage, out_storage, ref_storage;
  char* in = nullptr;
  char* out = nullptr;
  char* ref = nullptr;
  int access = 0;
};

/// Runs the push form's data path for `plan(world, rank)` and compares every rank's output with
/// the regions copied row by row. Rank r's views start `shift(r)` bytes past 16-byte alignment.
void run_case(const std::string& name, int world,
              const std::function<ExchangePlan(int, int)>& plan) {
  SCOPED_TRACE(name + " world " + std::to_string(world));
  std::mt19937 rng(static_cast<unsigned>(world * 7919 + name.size()));
  const int shifts[] = {0, 4, 2, 1, 8, 6, 3, 12};
  std::vector<Rank> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    Rank& k = ranks[static_cast<std::size_t>(r)];
    k.plan = plan(world, r);
    ASSERT_GT(k.plan.push_slot_bytes, 0) << "a plan the push form cannot carry";
    std::int64_t in_bytes = 0, out_bytes = 0;
    for (int q = 0; q < world; ++q) {
      in_bytes = std::max(in_bytes, extent(k.plan.to[q], true));
      out_bytes = std::max(out_bytes, extent(k.plan.from[q], false));
    }
    const int shift = shifts[r % 8];
    k.in_storage.resize(static_cast<std::size_t>(in_bytes + 32));
    k.out_storage.assign(static_cast<std::size_t>(out_bytes + 32), '\x5a');
    k.ref_storage = k.out_storage;
    // 16-byte aligned bases, then the shift.
    auto aligned = [](std::vector<char>& v) {
      auto p = reinterpret_cast<std::uintptr_t>(v.data());
      return v.data() + ((16 - p % 16) % 16);
    };
    k.in = aligned(k.in_storage) + shift;
    k.out = aligned(k.out_storage) + shift;
    k.ref = aligned(k.ref_storage) + shift;
    for (std::int64_t b = 0; b < in_bytes; ++b) k.in[b] = static_cast<char>(rng());
    // The width the launcher picks: what the rank's own regions and pointers allow, at most 8.
    k.access = std::min({8, kernels::access_for(k.plan.from.data(), world, k.out, nullptr),
                         kernels::access_for(k.plan.to.data(), world, k.in, nullptr)});
    ASSERT_GT(k.access, 0);
  }
  // Push: slot[d][s] holds the lines rank s sent rank d.
  std::vector<std::vector<std::vector<Line>>> slot(
      static_cast<std::size_t>(world),
      std::vector<std::vector<Line>>(static_cast<std::size_t>(world)));
  for (int s = 0; s < world; ++s) {
    const Rank& k = ranks[static_cast<std::size_t>(s)];
    for (int d = 0; d < world; ++d) {
      if (d == s) continue;
      const CopyRegion& c = k.plan.to[d];
      const Lines l(c);
      auto& lines = slot[static_cast<std::size_t>(d)][static_cast<std::size_t>(s)];
      lines.resize(l.count);
      with_access(k.access, [&]<int A>() {
        for (std::uint32_t i = 0; i < l.count; ++i) lines[i] = kernels::load_line<A>(k.in, c, l, i);
      });
      EXPECT_LE(kernels::exchange_push_slot_bytes(c.rows * c.row_bytes), k.plan.push_slot_bytes);
    }
  }
  // Take, and the reference.
  for (int d = 0; d < world; ++d) {
    Rank& k = ranks[static_cast<std::size_t>(d)];
    for (int s = 0; s < world; ++s) {
      const CopyRegion& c = k.plan.from[s];
      const char* src = ranks[static_cast<std::size_t>(s)].in;
      for (std::int64_t row = 0; row < c.rows; ++row) {
        std::memcpy(k.ref + c.dst_offset + row * c.dst_pitch,
                    src + c.src_offset + row * c.src_pitch, static_cast<std::size_t>(c.row_bytes));
      }
      const Lines l(c);
      // The own region's lines go straight from the input to the output.
      std::vector<Line> own;
      if (s == d)
        with_access(k.access, [&]<int A>() {
          for (std::uint32_t i = 0; i < l.count; ++i)
            own.push_back(kernels::load_line<A>(k.in, c, l, i));
        });
      const auto& lines =
          s == d ? own : slot[static_cast<std::size_t>(d)][static_cast<std::size_t>(s)];
      ASSERT_EQ(lines.size(), l.count)
          << "rank " << s << " sent rank " << d << " another number of lines than it takes";
      with_access(k.access, [&]<int A>() {
        for (std::uint32_t i = 0; i < l.count; ++i)
          kernels::store_line<A>(k.out, c, l, i, lines[i]);
      });
    }
    EXPECT_EQ(std::memcmp(k.out_storage.data(), k.ref_storage.data(), k.out_storage.size()), 0)
        << "rank " << d << " (access " << k.access << ")";
  }
}

TEST(ExchangePush, LinesCarryEveryRegionBitwise) {
  for (int world = 2; world <= kMaxRanks; ++world) {
    run_case("all_gather 100 B", world, [](int w, int r) { return plan_all_gather(100, w, r); });
    run_case("all_gather 4 KiB", world, [](int w, int r) { return plan_all_gather(4096, w, r); });
    run_case("gather to the last", world,
             [](int w, int r) { return plan_gather(1004, w, r, w - 1); });
    run_case("all_to_all", world, [](int w, int r) { return plan_all_to_all(12 * w, w, r); });
    run_case("all_to_all, counts", world, [](int w, int r) {
      std::vector<std::int64_t> counts(static_cast<std::size_t>(w * w));
      for (int s = 0; s < w; ++s)
        for (int d = 0; d < w; ++d) counts[static_cast<std::size_t>(s * w + d)] = (s + 3 * d) % 5;
      return plan_all_to_all(counts, 4, w, r);
    });
    run_case("lm_head, uneven rows, odd shards", world, [](int w, int r) {
      std::vector<std::int64_t> rows(static_cast<std::size_t>(w));
      for (int q = 0; q < w; ++q) rows[static_cast<std::size_t>(q)] = q == 1 ? 0 : (q * 3) % 4 + 1;
      // Shards of 10 two-byte columns, the last one cut to 6 (rows of 20 and 12 bytes).
      return plan_lm_head(LmHeadLayout::counts(rows), 10, 10 * w - 4, 2, w, r);
    });
  }
}

// Every line of every region is exactly one entry of the list (`RegionList`), in order, and so goes
// to exactly one thread of any grid that takes the entries in turn.
TEST(ExchangePush, EveryLineIsOneEntryOfTheList) {
  const std::vector<std::vector<std::uint32_t>> region_lines{
      {0, 0}, {0, 1}, {5, 0, 7}, {128, 128, 128, 128, 128, 128, 128, 128}, {0, 1000, 3, 0, 4097}};
  auto check = [&]<int N>(const std::vector<std::uint32_t>& counts) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    const kernels::RegionList<N> list([&](int k) { return counts[static_cast<std::size_t>(k)]; });
    std::uint32_t g = 0;
    for (int k = 0; k < N; ++k)
      for (std::uint32_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i, ++g) {
        ASSERT_EQ(list.region(g), k) << "entry " << g;
        ASSERT_EQ(list.index(g, k), i) << "entry " << g;
      }
    EXPECT_EQ(list.total(), g);
  };
  for (const auto& counts : region_lines) {
    switch (counts.size()) {
      case 2:
        check.template operator()<2>(counts);
        break;
      case 3:
        check.template operator()<3>(counts);
        break;
      case 5:
        check.template operator()<5>(counts);
        break;
      default:
        check.template operator()<8>(counts);
        break;
    }
  }
}

}  // namespace
}  // namespace tpcomm
