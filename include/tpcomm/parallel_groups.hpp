// SPDX-License-Identifier: Apache-2.0
// SGLang's parallel groups (TP, attention TP, MoE EP, MoE TP) built from one world.
#pragma once

#include <memory>

#include "tpcomm/bootstrap.hpp"
#include "tpcomm/group.hpp"
#include "tpcomm/options.hpp"
#include "tpcomm/parallel_config.hpp"

namespace tpcomm {

/// The groups of one rank, with SGLang's rank layouts (see src/policy/parallel_layout.hpp for the
/// rules): TP (contiguous ranks; NCCL and the custom all-reduce), attention TP, MoE EP (strided)
/// and MoE TP. A group whose layout equals TP's is the same object as `tp()` (compare
/// addresses); the others get NCCL only (but see below), and a group of one rank gets no
/// communicator at all.
///
/// Fusion workspace (the Lamport buffers that serve the fused all-reduce + residual + RMSNorm
/// and small plain all-reduces), as SGLang places its two: the attention-TP group carries one,
/// and exactly one MoE group carries the other, MoE EP when it has more than one rank, else
/// MoE TP; the other MoE group carries none, nor does a group of one rank. A group object that
/// plays both roles carries one. `tp()` carries it only when it is one of those groups. A MoE
/// group (or an attention-TP group narrower than TP) that carries the workspace gets the custom
/// backend, whose Lamport buffers are that workspace, besides NCCL. Move-only.
class ParallelGroups {
 public:
  /// Collective over `world` (world size must equal `config.tp_size`). Throws
  /// `Error(kInvalidArgument)` naming the flag for sizes that do not divide.
  ParallelGroups(Bootstrap& world, int device, const ParallelConfig& config,
                 const Options& options = Options::from_env());
  ~ParallelGroups();
  ParallelGroups(ParallelGroups&&) noexcept;
  ParallelGroups& operator=(ParallelGroups&&) noexcept;

  [[nodiscard]] Group& tp() noexcept;
  [[nodiscard]] Group& attn_tp() noexcept;
  [[nodiscard]] Group& moe_ep() noexcept;
  [[nodiscard]] Group& moe_tp() noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tpcomm
