// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/agree.hpp"

#include <span>

namespace tpcomm {

std::string agree(Bootstrap& boot, std::string_view local_error) {
  const auto all =
      boot.all_gather(std::as_bytes(std::span(local_error.data(), local_error.size())));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    return "rank " + std::to_string(r) + ": " +
           std::string(reinterpret_cast<const char*>(all[r].data()), all[r].size());
  }
  return {};
}

}  // namespace tpcomm
