// SPDX-License-Identifier: Apache-2.0
// `tpcomm step`: one decode step's communication of a model, captured per rank in one CUDA graph
// in the order the model issues it, replayed, checked and timed for each way of serving it.
#include <cuda_runtime.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/test_data.hpp"
#include "tools/commands.hpp"
#include "tools/json_file.hpp"
#include "tools/ranks.hpp"
#include "tools/step_args.hpp"
#include "tools/step_paths.hpp"
#include "tools/step_plan.hpp"
#include "tools/step_report.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/moe.hpp"
#include "tpcomm/norm.hpp"
#include "tune/graph_timer.hpp"

namespace tpcomm::tools {
namespace {

Options variant_options(Variant v) {
  Options opt = Options::from_env();
  if (v != Variant::kTpcomm) opt.lm_head_a2a = Switch::kOff;
  if (v == Variant::kNccl) opt.disable_custom_ar = true;
  return opt;
}

PartGroups all_parts(Group* g) { return {g, g, g}; }

/// The index in `kComponents` of the part a call of kind `k` belongs to.
std::size_t component_of(StepOpKind k) {
  switch (k) {
    case StepOpKind::kAttnReduce:
      return 0;
    case StepOpKind::kMlpReduce:
    case StepOpKind::kMoeReduce:
      return 1;
    case StepOpKind::kLmHead:
      return 2;
  }
  return 0;
}

bool in_part(StepOpKind k, Part p) {
  return p == Part::kAll || (p != Part::kCompute && kComponents[component_of(k)] == p);
}

// NOTE [step data]
// Every reduction's input is A (exact `fill_data` sum data) or B (A negated), alternating, the
// last one A again: the residual, in place and zero at the start, runs S, 0, S, 0, ..., S, 2S
// (S the all-reduce of A, |S| <= 64 at 8 ranks), exact in bf16 at every step, and ends at 2S,
// which a skipped or repeated operation would change. gamma is zero, so every norm output is a
// zero with its residual's sign: exact too, and an unwritten (poisoned) one is NaN. The LM head
// exchanges `fill_data` shards, checked by `check_lm_head`.
// A MoE layer's combine gives its input back exactly: token t's k-th expert row is a copy of row
// t of A (or B), the router's weights are 1 (0 with a shared expert, whose output is row t
// itself), then +1/2, -1/2, +1/4, -1/4, ... (a last one without its pair 0), so the weighted sum
// is the row, exact in f32 for these small integers, and a weight or a row left out changes it.

class StepRunner final : public StepParts {
 public:
  StepRunner(Bootstrap& boot, int device, const StepOptions& o, const ModelSpec& model,
             std::uint64_t seed)
      : boot_(boot), device_(device), o_(o), model_(model), seed_(seed) {}

  ~StepRunner() {
    graph_.reset();
    for (void* p : {xa_, xb_, residual_, normed_, gamma_, shards_, logits_, experts_a_, experts_b_,
                    combined_, map_, weights_})
      cudaFree(p);
    cudaFreeHost(wrong_host_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  /// Runs every variant at every token count; fills `results[tokens index][variant]` and
  /// `*compute_us` (the gaps alone, measured; 0 without gaps). Returns false after a failure.
  bool run(std::vector<std::array<Result, kVariants.size()>>& results, double* compute_us) {
    DeviceGuard guard(device_);
    allocate();
    results.assign(o_.tokens.size(), {});
    *compute_us = 0;
    const bool share = boot_.world_size() > 1 && ranks_share_gpu(boot_, device_);
    const std::size_t configs = o_.tokens.size() * kVariants.size();
    std::size_t done = 0;
    for (std::size_t vi = 0; vi < kVariants.size(); ++vi) {
      const Variant v = kVariants[vi];
      std::unique_ptr<Group> group;
      std::string why;
      if (v == Variant::kNccl && share) {
        why = "NCCL refuses two ranks on one GPU (virtual ranks); run one process per GPU (-g N)";
      } else {
        try {
          group = make_group(variant_options(v));
        } catch (const Error& e) {
          if (v != Variant::kNccl) {
            if (boot_.rank() == 0)
              std::printf("# %s: cannot build the group: %s\n", variant_name(v), e.what());
            return false;
          }
          group.reset();
          why = std::string("NCCL cannot run here: ") + e.what();
        }
        const StepPlan p = plan_step(model_, o_.tp, o_.tokens.front());
        if (group && v == Variant::kNccl && boot_.world_size() > 1 &&
            group->backend_for_all_reduce(act(xa_, p), act(normed_, p)) != "nccl") {
          group.reset();
          why = "NCCL is not available (libnccl.so.2, TPCOMM_NCCL_PATH, TPCOMM_DISABLE_NCCL)";
        }
      }
      for (std::size_t ti = 0; ti < o_.tokens.size(); ++ti) {
        Result& r = results[ti][vi];
        if (!group) {
          r.reason = why;
        } else {
          const StepPlan plan = plan_step(model_, o_.tp, o_.tokens[ti]);
          if (o_.compute_us > 0 && *compute_us == 0) *compute_us = measure_compute(plan);
          measure(all_parts(group.get()), v, plan, r);
          if (!r.failure.empty()) {
            if (boot_.rank() == 0)
              std::printf("# %s, %lld tokens: failed: %s\n", variant_name(v),
                          static_cast<long long>(o_.tokens[ti]), r.failure.c_str());
            return false;
          }
        }
        ++done;
        if (boot_.rank() == 0 && !o_.quiet && isatty(STDERR_FILENO) != 0)
          std::fprintf(stderr, "[tpcomm step] %s, %lld tokens, %s: %zu/%zu configurations\n",
                       model_.name.c_str(), static_cast<long long>(o_.tokens[ti]), variant_name(v),
                       done, configs);
      }
    }
    return true;
  }

  // StepParts (tools/step_paths.hpp), for `find_fastest`.
  std::unique_ptr<Group> make_group(const Options& options) override {
    auto g = std::make_unique<Group>(boot_, device_, options);
    g->prepare_exchange(exchange_bytes_per_peer(), stream());
    if (Status st = g->warm_up(stream()); st != Status::kOk) throw Error(st, g->last_error());
    return g;
  }
  double time_part(Group& g, std::int64_t tokens, Part part, std::string& failure) override {
    return time_part(all_parts(&g), Variant::kTpcomm, plan_step(model_, o_.tp, tokens), part, false,
                     failure);
  }
  void measure(const PartGroups& groups, std::int64_t tokens, Result& r) override {
    measure(groups, Variant::kTpcomm, plan_step(model_, o_.tp, tokens), r);
  }
  bool lead() const override { return boot_.rank() == 0; }

 private:
  std::int64_t max_tokens() const {
    std::int64_t t = 0;
    for (std::int64_t x : o_.tokens) t = std::max(t, x);
    return t;
  }

  /// The exchange staging that holds the LM head's input at the largest token count.
  std::int64_t exchange_bytes_per_peer() const {
    const StepPlan p = plan_step(model_, o_.tp, max_tokens());
    const std::int64_t in = p.ops.back().in_bytes;
    return std::max<std::int64_t>(std::int64_t{4} << 20, (in + o_.tp - 1) / o_.tp);
  }

  Stream stream() const { return reinterpret_cast<Stream>(stream_); }

  void allocate() {
    TPCOMM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Our own kernels once on the stream before any collective (NOTE [first launch]).
    if (kernels::warm_up_test_data(stream()) != Status::kOk)
      throw Error(Status::kCudaError, "launching the test-data kernels failed");
    TPCOMM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    graph_ = std::make_unique<GraphTimer>(stream());
    const StepPlan p = plan_step(model_, o_.tp, max_tokens());
    const StepOp& head = p.ops.back();
    const auto act = static_cast<std::size_t>(p.ops.front().in_bytes);
    for (void** b : {&xa_, &xb_, &residual_, &normed_}) TPCOMM_CUDA_CHECK(cudaMalloc(b, act));
    const auto gamma_bytes = static_cast<std::size_t>(model_.hidden) * dtype_size(model_.dtype);
    TPCOMM_CUDA_CHECK(cudaMalloc(&gamma_, gamma_bytes));
    TPCOMM_CUDA_CHECK(cudaMemset(gamma_, 0, gamma_bytes));
    TPCOMM_CUDA_CHECK(cudaMalloc(&shards_, static_cast<std::size_t>(head.in_bytes)));
    TPCOMM_CUDA_CHECK(cudaMalloc(&logits_, static_cast<std::size_t>(head.out_bytes)));
    if (model_.moe) {
      const auto routed = static_cast<std::size_t>(max_tokens() * model_.top_k);
      for (void** b : {&experts_a_, &experts_b_})
        TPCOMM_CUDA_CHECK(cudaMalloc(
            b, routed * static_cast<std::size_t>(model_.hidden) * dtype_size(model_.dtype)));
      TPCOMM_CUDA_CHECK(cudaMalloc(&combined_, act));
      TPCOMM_CUDA_CHECK(cudaMalloc(&map_, routed * sizeof(std::int32_t)));
      TPCOMM_CUDA_CHECK(cudaMalloc(&weights_, routed * sizeof(float)));
    }
    TPCOMM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&wrong_host_),
                                    sizeof(unsigned long long), cudaHostAllocMapped));
    TPCOMM_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&wrong_), wrong_host_, 0));
  }

  TensorView act(void* p, const StepPlan& plan) const {
    return TensorView::contiguous(p, model_.dtype, {plan.tokens, model_.hidden}, device_);
  }
  /// A MoE layer's combine inputs for input `x` (xa_ or xb_; NOTE [step data]).
  MoeCombine moe_inputs(const void* x, const StepOp& op, const StepPlan& plan) const {
    const std::int64_t routed = plan.tokens * op.top_k;
    MoeCombine m;
    m.experts = TensorView::contiguous(x == xa_ ? experts_a_ : experts_b_, model_.dtype,
                                       {routed, model_.hidden}, device_);
    m.map = TensorView::contiguous(map_, DType::kI32, {plan.tokens, op.top_k}, device_);
    m.weights = TensorView::contiguous(weights_, DType::kF32, {plan.tokens, op.top_k}, device_);
    if (op.shared) m.shared = act(const_cast<void*>(x), plan);
    return m;
  }

  /// The combine's constant inputs for `plan` (NOTE [step data]), and every MoE input's expert
  /// rows copied from A and B. After `xa_` and `xb_` are filled.
  bool fill_moe(const StepPlan& plan) {
    const std::int64_t k = model_.top_k;
    const std::size_t routed = static_cast<std::size_t>(plan.tokens * k);
    std::vector<std::int32_t> map(routed);
    std::vector<float> weights(routed);
    for (std::size_t i = 0; i < routed; ++i) {
      const auto j = static_cast<std::int64_t>(i) % k;
      map[i] = static_cast<std::int32_t>(i);
      const float half = std::ldexp(1.f, -static_cast<int>((j + 1) / 2));
      weights[i] = j == 0       ? (model_.shared_experts > 0 ? 0.f : 1.f)
                   : j % 2 == 0 ? -half
                   : j + 1 < k  ? half
                                : 0.f;
    }
    // From pageable memory: each copy has read its source when it returns.
    if (cudaMemcpyAsync(map_, map.data(), routed * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                        stream_) != cudaSuccess ||
        cudaMemcpyAsync(weights_, weights.data(), routed * sizeof(float), cudaMemcpyHostToDevice,
                        stream_) != cudaSuccess)
      return false;
    const std::size_t row = static_cast<std::size_t>(model_.hidden) * dtype_size(model_.dtype);
    for (auto [from, to] : {std::pair{xa_, experts_a_}, std::pair{xb_, experts_b_}})
      for (std::int64_t j = 0; j < k; ++j)
        if (cudaMemcpy2DAsync(static_cast<char*>(to) + j * row, k * row, from, row, row,
                              static_cast<std::size_t>(plan.tokens), cudaMemcpyDeviceToDevice,
                              stream_) != cudaSuccess)
          return false;
    return true;
  }

  TensorView shards(const StepPlan& plan) const {
    const StepOp& h = plan.ops.back();
    return TensorView::contiguous(shards_, model_.dtype, {h.rows * plan.tp, h.cols}, device_);
  }
  TensorView logits(const StepPlan& plan) const {
    return TensorView::contiguous(logits_, model_.dtype, {plan.tokens, model_.vocab}, device_);
  }

  /// Enqueues the operations of `part` of `plan` as variant `v` serves them, each on its part's
  /// group and after a compute gap when `gaps`; only the gaps for Part::kCompute. Empty, or what
  /// failed.
  std::string enqueue(const PartGroups& groups, Variant v, const StepPlan& plan, Part part,
                      bool gaps) {
    constexpr float kEps = 1e-6f;
    const auto gap_ns = static_cast<std::uint64_t>(o_.compute_us * 1000.0);
    const auto reductions = static_cast<std::int64_t>(plan.ops.size()) - 1;
    std::int64_t k = 0;  // index of the reduction
    for (const StepOp& op : plan.ops) {
      const bool is_reduction = op.kind != StepOpKind::kLmHead;
      const std::int64_t index = is_reduction ? k++ : -1;
      if (gaps && (part == Part::kCompute || in_part(op.kind, part)))
        if (kernels::busy_wait(gap_ns, stream()) != Status::kOk) return "the compute gap's launch";
      if (part == Part::kCompute || !in_part(op.kind, part)) continue;
      Group* g = groups[component_of(op.kind)];
      Status st = Status::kOk;
      if (is_reduction) {
        // NOTE [step data]
        void* x = index % 2 == 0 || index == reductions - 1 ? xa_ : xb_;
        const TensorView gamma = TensorView::flat(gamma_, model_.dtype, model_.hidden, device_);
        const TensorView res = act(residual_, plan);
        const TensorView out = act(normed_, plan);
        auto reduce = [&](const TensorView& in) {
          if (v == Variant::kTpcomm)
            return g->all_reduce_add_rmsnorm(in, res, gamma, kEps, out, res, stream());
          const Status s = g->all_reduce(in, out, stream());
          return s == Status::kOk ? add_rmsnorm(out, res, gamma, kEps, out, res, stream()) : s;
        };
        if (op.kind != StepOpKind::kMoeReduce) {
          st = reduce(act(x, plan));
        } else if (v == Variant::kTpcomm && o_.moe_fused) {
          st = g->moe_finalize_all_reduce_add_rmsnorm(moe_inputs(x, op, plan), res, gamma, kEps,
                                                      out, res, stream());
        } else {
          st = moe_combine(moe_inputs(x, op, plan), act(combined_, plan), stream());
          if (st == Status::kOk) st = reduce(act(combined_, plan));
        }
      } else {
        st = g->lm_head_exchange(shards(plan), logits(plan), LmHeadLayout::equal(plan.tokens),
                                 stream());
      }
      if (st != Status::kOk)
        return std::string(to_string(op.kind)) + " of layer " + std::to_string(op.layer) + ": " +
               std::string(to_string(st)) + ": " + g->last_error();
    }
    return {};
  }

  /// Captures `part` into the graph (inside a capture scope of each group). Empty, or what
  /// failed.
  std::string capture(const PartGroups& groups, Variant v, const StepPlan& plan, Part part,
                      bool gaps) {
    cudaStreamSynchronize(stream_);  // no rank captures while its kernels are in flight
    boot_.barrier();
    std::array<std::optional<Group::CaptureScope>, kComponents.size()> scopes;
    for (std::size_t i = 0; i < groups.size(); ++i)
      if (groups[i] != nullptr && std::find(groups.begin(), groups.begin() + i, groups[i]) ==
                                      groups.begin() + static_cast<std::ptrdiff_t>(i))
        scopes[i].emplace(groups[i]->capture(stream()));
    std::string failure = graph_->capture([&] { return enqueue(groups, v, plan, part, gaps); });
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (!scopes[i]) continue;
      if (Status st = scopes[i]->close(); st != Status::kOk && failure.empty())
        failure = "capture registration: " + groups[i]->last_error();
    }
    return failure;
  }

  /// The first failure of the groups' health, or empty.
  static std::string health(const PartGroups& groups) {
    for (Group* g : groups)
      if (g != nullptr && g->health() != Status::kOk) return g->last_error();
    return {};
  }

  /// The median replay of `part`'s graph, averaged over ranks; the graph is destroyed after.
  double time_part(const PartGroups& groups, Variant v, const StepPlan& plan, Part part, bool gaps,
                   std::string& failure) {
    double us = 0;
    failure = capture(groups, v, plan, part, gaps);
    if (failure.empty()) failure = graph_->time(boot_, o_.replays, &us, o_.warmup);
    if (failure.empty()) failure = health(groups);
    graph_->reset();  // NOTE [graphs of virtual ranks]: before the next collective
    return agree(us, failure);
  }

  /// Averages `us` over ranks; a failure anywhere is a failure everywhere.
  double agree(double us, std::string& failure) {
    struct Mine {
      double us;
      std::int32_t failed;
    } mine{us, failure.empty() ? 0 : 1};
    double sum = 0;
    const auto all = boot_.all_gather_value(mine);
    for (const Mine& m : all) {
      sum += m.us;
      if (m.failed != 0 && failure.empty()) failure = "failed on another rank";
    }
    return sum / static_cast<double>(all.size());
  }

  double measure_compute(const StepPlan& plan) {
    std::string failure;
    const double us =
        time_part(PartGroups{}, Variant::kTpcomm, plan, Part::kCompute, true, failure);
    if (!failure.empty()) throw Error(Status::kCudaError, "timing the compute gaps: " + failure);
    return us;
  }

  /// Fresh data, poisoned outputs, one replay of the captured step, the final outputs checked
  /// bitwise (NOTE [step data]). Returns the wrong elements on this rank.
  std::uint64_t check(const StepPlan& plan, std::string& failure) {
    const std::int64_t n = plan.tokens * model_.hidden;
    const StepOp& head = plan.ops.back();
    const std::uint64_t lm_seed = seed_ ^ 0x1e4d;
    const auto es = static_cast<std::int64_t>(dtype_size(model_.dtype));
    *wrong_host_ = 0;  // nothing in flight reads it
    bool ok =
        kernels::fill_data(xa_, model_.dtype, n, seed_, boot_.rank(), ReduceOp::kSum, 0,
                           stream()) == Status::kOk &&
        kernels::fill_data(xb_, model_.dtype, n, seed_, boot_.rank(), ReduceOp::kSum, 0,
                           stream()) == Status::kOk &&
        kernels::negate_data(xb_, model_.dtype, n, stream()) == Status::kOk &&
        kernels::fill_data(shards_, model_.dtype, head.in_bytes / es, lm_seed, boot_.rank(),
                           ReduceOp::kSum, 0, stream()) == Status::kOk &&
        (!model_.moe || fill_moe(plan)) &&
        cudaMemsetAsync(residual_, 0, static_cast<std::size_t>(n * es), stream_) == cudaSuccess &&
        kernels::poison(normed_, n * es, stream()) == Status::kOk &&
        kernels::poison(logits_, head.out_bytes, stream()) == Status::kOk;
    if (!ok) {
      failure = "preparing the test data";
      return 0;
    }
    // NOTE [graphs of virtual ranks]: every rank ready before any rank replays, and nothing but
    // the replay between the barrier and the wait for it.
    cudaStreamSynchronize(stream_);
    boot_.barrier();
    if (failure = graph_->replay(); !failure.empty()) return 0;
    cudaStreamSynchronize(stream_);
    ok = kernels::check_residual_norm(residual_, normed_, model_.dtype, n, seed_,
                                      boot_.world_size(), 2, wrong_, stream()) == Status::kOk &&
         kernels::check_lm_head(logits_, model_.dtype, plan.tokens, model_.vocab, head.cols,
                                plan.tokens * boot_.rank(), lm_seed, wrong_,
                                stream()) == Status::kOk;
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess || !ok)
      failure = std::string("checking the step: ") + cudaGetErrorString(e);
    return *static_cast<volatile unsigned long long*>(wrong_host_);
  }

  /// One variant at one token count, each part on its group: the step checked and timed (with
  /// gaps), then each component alone.
  void measure(const PartGroups& groups, Variant v, const StepPlan& plan, Result& r) {
    r.available = true;
    const TensorView x = act(xa_, plan);
    Group& reductions = *groups[0];
    const std::string reduce = reductions.backend_for_all_reduce(x, act(normed_, plan), true);
    r.fused_by = v == Variant::kTpcomm
                     ? reductions.backend_for_add_rmsnorm(x, act(normed_, plan), true)
                     : reduce + "+add_rmsnorm";
    r.lm_head_by = groups[2]->backend_for_lm_head_exchange(shards(plan), logits(plan),
                                                           LmHeadLayout::equal(plan.tokens));
    const bool gaps = o_.compute_us > 0;
    r.failure = capture(groups, v, plan, Part::kAll, gaps);
    std::uint64_t wrong = 0;
    if (r.failure.empty()) wrong = check(plan, r.failure);
    if (r.failure.empty()) r.failure = graph_->time(boot_, o_.replays, &r.step_us, o_.warmup);
    if (r.failure.empty()) r.failure = health(groups);
    graph_->reset();  // NOTE [graphs of virtual ranks]
    struct Mine {
      double us;
      std::uint64_t wrong;
      std::int32_t failed;
    } mine{r.step_us, wrong, r.failure.empty() ? 0 : 1};
    const auto all = boot_.all_gather_value(mine);
    double sum = 0;
    for (const Mine& m : all) {
      sum += m.us;
      r.wrong += m.wrong;
      if (m.failed != 0 && r.failure.empty()) r.failure = "failed on another rank";
    }
    r.step_us = sum / static_cast<double>(all.size());
    for (std::size_t c = 0; c < kComponents.size() && r.failure.empty(); ++c)
      r.part_us[c] = time_part(groups, v, plan, kComponents[c], false, r.failure);
  }

  Bootstrap& boot_;
  int device_;
  const StepOptions& o_;
  const ModelSpec& model_;
  std::uint64_t seed_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GraphTimer> graph_;  // on `stream_`
  void* xa_ = nullptr;
  void* xb_ = nullptr;
  void* residual_ = nullptr;
  void* normed_ = nullptr;
  void* gamma_ = nullptr;
  void* shards_ = nullptr;
  void* logits_ = nullptr;
  // MoE models: the experts' rows of A and B, the combine's output, the map and the weights.
  void* experts_a_ = nullptr;
  void* experts_b_ = nullptr;
  void* combined_ = nullptr;
  void* map_ = nullptr;
  void* weights_ = nullptr;
  unsigned long long* wrong_host_ = nullptr;
  unsigned long long* wrong_ = nullptr;  // the device's view of `wrong_host_`
};

int run_step(const StepOptions& o) {
  for (const auto& [flag, path] : {std::pair{"--json", o.json}, std::pair{"--plot", o.plot}}) {
    if (path.empty()) continue;
    if (const std::string why = check_writable(path); !why.empty()) {
      std::fprintf(stderr, "tpcomm step: %s \"%s\": %s\n", flag, path.c_str(), why.c_str());
      return 1;
    }
  }
  const ModelSpec model = load_model_file(find_model(o.model, step_roots()));
  (void)plan_step(model, o.tp, o.tokens.front());  // refuses a bad --tp before any GPU work
  RankPlan plan{o.virtual_ranks, o.gpus, o.timeout_s, {}};
  std::uint64_t seed = o.seed;
  if (seed == 0)
    seed = (static_cast<std::uint64_t>(std::random_device{}()) << 32) | std::random_device{}();
  const std::string mode = rank_mode(plan);
  return for_each_rank(plan, [&](Bootstrap& boot, int device) {
    if (boot.world_size() != o.tp) {
      if (boot.rank() == 0)
        std::fprintf(stderr,
                     "tpcomm step: --tp %d needs %d ranks, this run has %d: add --virtual-ranks "
                     "%d (one GPU) or -g %d (one process per GPU)\n",
                     o.tp, o.tp, boot.world_size(), o.tp, o.tp);
      return 1;
    }
    // Every rank must use the same data: rank 0's seed decides.
    const std::uint64_t shared_seed = boot.broadcast_value(seed, 0);
    if (boot.rank() == 0)
      std::printf(
          "# tpcomm step %s: %s (%s): hidden %lld, %lld layers, vocab %lld, %s%s; tp %d "
          "(%s), seed %llu\n",
          TPCOMM_VERSION, model.name.c_str(), model.source.c_str(),
          static_cast<long long>(model.hidden), static_cast<long long>(model.layers),
          static_cast<long long>(model.vocab), std::string(to_string(model.dtype)).c_str(),
          model.moe ? ", MoE" : "", o.tp, mode.c_str(),
          static_cast<unsigned long long>(shared_seed));
    std::vector<std::array<Result, kVariants.size()>> results;
    std::vector<Fastest> fastest;
    double compute_us = 0;
    bool ok = false;
    {
      StepRunner runner(boot, device, o, model, shared_seed);
      ok = runner.run(results, &compute_us) &&
           (!o.fastest ||
            find_fastest(runner, path_candidates(variant_options(Variant::kTpcomm), model.moe), o,
                         model.name, fastest));
    }
    if (boot.rank() != 0) return ok ? 0 : 1;
    if (!ok) {
      std::printf("# a step failed: see the failure lines above\n");
      return 1;
    }
    nlohmann::json doc =
        report(o, model, results, compute_us, boot.world_size(), mode, shared_seed);
    if (o.fastest) {
      doc["fastest"] = report_fastest(o.tokens, results, fastest);
      for (const Fastest& f : fastest)
        doc["wrong"] = doc["wrong"].get<std::uint64_t>() + f.step.wrong;
    }
    const int code = doc["wrong"].get<std::uint64_t>() == 0 ? 0 : 2;
    const std::string json = o.plot.empty() ? o.json : step_plot_json(o);
    if (!json.empty()) {
      if (const std::string why = write_json_file(json, doc); !why.empty()) {
        std::fprintf(stderr, "tpcomm step: --json \"%s\": %s\n", json.c_str(), why.c_str());
        return code == 0 ? 1 : code;
      }
    }
    if (!o.plot.empty() && plot(json, o.plot) != 0 && code == 0) return 1;
    return code;
  });
}

}  // namespace

void add_step_command(CLI::App& app, Command& run) {
  auto* cmd = app.add_subcommand(
      "step",
      "one decode step's communication of a model, as CUDA graphs: tpcomm's paths against "
      "the unfused ones and NCCL");
  auto o = std::make_shared<StepOptions>();
  // Scheduled by the options' own checks, once they pass (NOTE [one callback per command]).
  add_step_options(*cmd, *o, [o, &run] { run = [o] { return run_step(*o); }; });
}

}  // namespace tpcomm::tools
