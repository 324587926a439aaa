// SPDX-License-Identifier: Apache-2.0
// "Every rank agrees or all fall back": the one vote the backends take after a local step.
#pragma once

#include <string>
#include <string_view>

#include "tpcomm/bootstrap.hpp"

namespace tpcomm {

/// Collective: every rank says whether its local step worked (`local_error` empty) or why not.
/// Returns an empty string when every rank's step worked, else "rank R: <its error>" for the
/// lowest failing rank R — the same string on every rank, so that all ranks go on or all fall
/// back alike (DESIGN.md §3). Throws what the bootstrap throws (a peer that never arrives).
std::string agree(Bootstrap& boot, std::string_view local_error);

}  // namespace tpcomm
