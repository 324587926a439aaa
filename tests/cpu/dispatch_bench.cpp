// SPDX-License-Identifier: Apache-2.0
// CPU micro-benchmark of the host-side dispatch decision of an all-reduce: the chain walk,
// the selector's hard requirements and the tuned-table lookup. Backends here do no GPU work,
// so the numbers are the decision's own cost.
#include <benchmark/benchmark.h>

#include "backends/backend.hpp"
#include "tune/selector.hpp"
#include "tune/table.hpp"

namespace tpcomm {
namespace {

/// Decides like the custom all-reduce backend (real selector, real table) and launches nothing.
class SelectingBackend final : public Backend {
 public:
  SelectingBackend(SelectorCaps caps, const TuneTable* table) : caps_(caps), table_(table) {}
  std::string_view name() const noexcept override { return "custom_ar"; }
  Plan plan(const Request& r) const noexcept override {
    if (r.op != Op::kAllReduce) return Plan::no("only all-reduce");
    const Choice c =
        select_all_reduce(r.in.nbytes(), r.in.dtype, r.reduce()->op, caps_, Pinned{}, table_);
    return c.algo == Algo::kNone ? Plan::no("outside the custom kernels")
                                 : Plan::yes({this, c.algo, ExchangeAlgo::kNone, c.shape()});
  }
  Status run(const Request&, const Plan& p, Stream) noexcept override {
    benchmark::DoNotOptimize(p.step.shape.blocks);
    return Status::kOk;
  }

 private:
  SelectorCaps caps_;
  const TuneTable* table_;
};

class LastBackend final : public Backend {
 public:
  std::string_view name() const noexcept override { return "nccl"; }
  Plan plan(const Request&) const noexcept override { return Plan::yes({this}); }
  Status run(const Request&, const Plan&, Stream) noexcept override { return Status::kOk; }
};

TuneTable make_table(std::int64_t max_bytes) {
  std::vector<TuneEntry> entries;
  for (std::int64_t b : TuneTable::bucket_bounds(max_bytes))
    entries.push_back({b, {b < (256 << 10) ? Algo::kOneShot : Algo::kTwoShot, 8, 512}, 5.0});
  return TuneTable(TuneKey{"bench", 8, "p2p", 0, 0, "0"}, std::move(entries));
}

void BM_ChainDispatch(benchmark::State& state) {
  const std::int64_t bytes = state.range(0);
  static const TuneTable table = make_table(8 << 20);
  SelectorCaps caps{8, true, 8 << 20, 36};
  BackendChain chain;
  chain.add(std::make_unique<SelectingBackend>(caps, &table));
  chain.add(std::make_unique<LastBackend>());
  Request r;
  r.in = TensorView::flat(reinterpret_cast<void*>(256), DType::kBF16, bytes / 2);
  r.out = r.in;
  for (auto _ : state) benchmark::DoNotOptimize(chain.run(r, nullptr));
}
// 1 KiB and 1 MiB are served by the custom backend; 64 MiB falls through to the last backend.
BENCHMARK(BM_ChainDispatch)->Arg(1 << 10)->Arg(1 << 20)->Arg(64 << 20);

void BM_TableLookup(benchmark::State& state) {
  static const TuneTable table = make_table(8 << 20);
  std::int64_t bytes = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(table.lookup(bytes));
    bytes = bytes * 3 % (8 << 20) + 1;
  }
}
BENCHMARK(BM_TableLookup);

}  // namespace
}  // namespace tpcomm

BENCHMARK_MAIN();
