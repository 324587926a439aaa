// SPDX-License-Identifier: Apache-2.0
// The backend of a group of one rank.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace tpcomm {

/// World size 1: every collective is a copy (or nothing, in place); the fused norm and the
/// LM-head exchange are left to their composite paths (ops/).
[[nodiscard]] std::unique_ptr<Backend> make_local_backend();

}  // namespace tpcomm
