// SPDX-License-Identifier: Apache-2.0
// Where the ranks of a `tpcomm bench`/`tpcomm tune` run come from.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tpcomm/bootstrap.hpp"

namespace tpcomm::tools {

struct RankPlan {
  /// > 0: that many ranks as threads of this process, all on GPU 0.
  int virtual_ranks = 0;
  /// > 0: start that many processes of this program (one per GPU) and wait for them.
  int gpus = 0;
  /// Deadline of a self-launched run.
  int timeout_s = 600;
  /// Extra environment for self-launched children.
  std::vector<std::pair<std::string, std::string>> child_env;
};

/// How this process runs: "virtual ranks", "launched" (a child of `-g`), or "launcher" (torchrun,
/// mpirun, srun, or a single process).
std::string rank_mode(const RankPlan& plan);

/// Runs `body(bootstrap, device)` once per rank of this process: on each of `virtual_ranks`
/// threads; or, with `gpus`, re-executes this program in that many processes (without its
/// `-g`/`--ngpus` argument) through the local launcher and returns its exit code; or once,
/// with the rank the launch environment describes (device = local rank modulo visible GPUs).
/// Returns 77 where there is no GPU, else the first non-zero exit code of a rank.
int for_each_rank(const RankPlan& plan, const std::function<int(Bootstrap&, int device)>& body);

/// Whether two ranks of `boot` use the same GPU (the same PCI bus id on the same node), where
/// NCCL refuses to run. Collective.
bool ranks_share_gpu(Bootstrap& boot, int device);

}  // namespace tpcomm::tools
