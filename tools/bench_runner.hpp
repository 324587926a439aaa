// SPDX-License-Identifier: Apache-2.0
// One row of `tpcomm bench`: the collective it measures, on the path the row names (a group with
// its algorithm, NCCL called directly, the unfused pair, a device copy).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backends/nccl_comm.hpp"
#include "core/check.hpp"
#include "tools/bench_args.hpp"
#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"

namespace tpcomm::tools {

/// Element counts of the two buffers of one collective of `count` reported elements.
struct Shape {
  std::int64_t in;
  std::int64_t out;
};

Shape shape_of(kernels::Collective op, std::int64_t count, int world);

/// Runs one collective on whichever path the row asks for.
class Runner {
 public:
  /// `exchange_bytes`: the largest input of an exchange in the sweep, which the group's
  /// exchange staging is prepared for.
  Runner(Bootstrap& boot, int device, const BenchOptions& o, const BenchAlgo& algo,
         std::int64_t exchange_bytes);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  Group* group() { return group_.get(); }

  /// Whether the output can be checked (a plain copy computes no collective).
  bool checkable() const { return algo_.kind != BenchAlgo::Kind::kMemcpy; }

  /// One operation of the row, `in` to `out`, of shape `s`.
  Status run(const void* in, void* out, const Shape& s, Stream stream);

  /// The path the row's operation of shape `s` takes, in words.
  std::string served_by(const Shape& s) const;

  /// What the row's output of shape `s` holds, for `check_data`: the result of `op`, `count`
  /// elements.
  struct Checked {
    kernels::Collective op;
    std::int64_t count;
  };
  Checked checked(const Shape& s) const {
    // The all-reduce form of the sequence-parallel norm keeps every row: residual_out is the
    // all-reduce of x, of which the scattered rows are this rank's slice.
    if (algo_.kind == BenchAlgo::Kind::kUnscattered) return {kernels::Collective::kAllReduce, s.in};
    return {o_.op, s.out};
  }

  /// Prepares `stream` before the row's first operation (NOTE [first launch] in
  /// backends/custom_ar.cpp): the bench's own kernels (fill, check) once, then the group's.
  Status warm_up(Stream stream) {
    TPCOMM_TRY(kernels::warm_up_test_data(stream));
    return group_ ? group_->warm_up(stream) : Status::kOk;
  }

  std::string last_error() const;

  /// The LM head's shapes for a shape of the sweep: [total, cols] shards, [rows, vocab] out.
  struct LmHead {
    std::int64_t rows, total, cols;
  };
  LmHead lm_head(const Shape& s) const {
    const std::int64_t rows = s.out / o_.vocab;
    return {rows, rows * world_, s.in / (rows * world_)};
  }

 private:
  static constexpr float kEps = 1e-6f;

  /// `[count / hidden, hidden]` of the bench's dtype at `p`.
  TensorView rows(void* p, std::int64_t count) const;
  /// The fused operation's other tensors, for the largest size: a residual of zeros (so that
  /// residual_out is the all-reduce, which the check verifies), gamma, norm_out, and the sum of
  /// the unfused pair.
  void allocate_fused();
  /// One fused operation on this row's path; `out` is residual_out.
  Status run_fused(const void* in, void* out, const Shape& s, Stream stream);
  /// One operation of the sequence-parallel form's row (`s.in` elements of x, `s.out` of each
  /// output); `out` is residual_out (of every row for the all-reduce form).
  Status run_scattered(const void* in, void* out, const Shape& s, Stream stream);
  /// The path of the sequence-parallel form's row.
  std::string scattered_served_by(const Shape& s) const;
  /// The MoE combine's map and weights for the largest size, and the shared expert's output (of
  /// zeros): token t takes row t of the input with weight 1 and top-k - 1 rows of its own past
  /// the largest x with weight 0 (distinct rows; the map holds for every size), so that x is the
  /// input's first rows, which the checks verify.
  void allocate_moe();
  /// The MoE finalize's combine over `in` (`moe_rows_` expert rows) for `count` elements of x.
  MoeCombine moe(const void* in, std::int64_t count) const;

  void* residual_ = nullptr;
  void* gamma_ = nullptr;
  void* norm_ = nullptr;
  void* sum_ = nullptr;
  void* map_ = nullptr;
  void* weights_ = nullptr;
  void* shared_ = nullptr;
  std::int64_t moe_rows_ = 0;  // expert rows of the largest size

  const BenchOptions& o_;
  BenchAlgo algo_;
  std::unique_ptr<Group> group_;
  std::unique_ptr<NcclComm> direct_;
  int world_ = 1;
};

}  // namespace tpcomm::tools
