// SPDX-License-Identifier: Apache-2.0
// "Every rank agrees or all fall back": the one vote the backends take after a local step.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "tpcomm/bootstrap.hpp"

namespace tpcomm {

/// Collective: every rank says whether its local step worked (`local_error` empty) or why not.
/// Returns an empty string when every rank's step worked, else "rank R: <its error>" for the
/// lowest failing rank R — the same string on every rank, so that all ranks go on or all fall
/// back alike (docs/DESIGN.md §3). Throws what the bootstrap throws (a peer that never arrives).
std::string agree(Bootstrap& boot, std::string_view local_error);

/// One setting that must be the same on every rank: how a person names it (its environment
/// variable, and where else it is set) and this rank's value, as text.
struct Setting {
  std::string_view name;
  std::string value;
};

/// Collective: checks that every rank holds the same value of each of `settings` (the same
/// names, in the same order, on every rank). Returns an empty string when they do, else one line
/// per setting that differs, naming it and the ranks with each value ("TPCOMM_LAMPORT_MAX_BYTES:
/// 512K on ranks 0, 2; 1M on rank 1") — the same string on every rank. Throws what the bootstrap
/// throws (a peer that never arrives).
std::string disagreements(Bootstrap& boot, std::span<const Setting> settings);

}  // namespace tpcomm
