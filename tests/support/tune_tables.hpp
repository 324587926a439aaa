// SPDX-License-Identifier: Apache-2.0
// What the tune table's and the tune file's tests share: a key, a table with a distinct choice
// in every bucket, a well-formed header, and the check of an error's status and message.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tpcomm/status.hpp"
#include "tune/table.hpp"

namespace tpcomm::testing {

inline constexpr std::int64_t kKiB = 1024;
inline constexpr std::int64_t kMiB = 1024 * 1024;

inline TuneKey h200_key() {
  return TuneKey{"NVIDIA H200", 8, "nvlink-full", 12040, 22703, "0.1.0"};
}

/// One entry per bound of bucket_bounds(max_bytes); entry i has i + 1 blocks so every bucket's
/// choice is distinct.
inline TuneTable numbered_table(std::int64_t max_bytes) {
  std::vector<TuneEntry> entries;
  int i = 0;
  for (std::int64_t b : TuneTable::bucket_bounds(max_bytes)) {
    Algo a = b < 256 * kKiB ? Algo::kOneShot : Algo::kTwoShot;
    entries.push_back(TuneEntry{b, Choice{a, i + 1, 512}, 3.5 + i});
    ++i;
  }
  return TuneTable(h200_key(), entries);
}

/// Runs `f`, which must throw `Error(status)` whose message contains `needle`.
template <class F>
void expect_error(F&& f, Status status, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
  }
}

inline const std::string kGoodHead =
    "# tpcomm tune table v2\n"
    "key gpu=\"NVIDIA H200\" world_size=8 topology=nvlink-full driver_version=12040 "
    "nccl_version=22703 tpcomm_version=0.1.0\n";

}  // namespace tpcomm::testing
