// SPDX-License-Identifier: Apache-2.0
// SGLang's parallelism flags, the input of the parallel groups' layout.
#pragma once

namespace tpcomm {

/// SGLang's parallelism flags that shape the groups (`--tp-size`, `--dp-size`,
/// `--enable-dp-attention`, `--attn-cp-size`, `--ep-size`, `--moe-dp-size`).
struct ParallelConfig {
  int tp_size = 1;
  int dp_size = 1;
  bool enable_dp_attention = false;
  int attn_cp_size = 1;
  int moe_ep_size = 1;
  int moe_dp_size = 1;
};

}  // namespace tpcomm
