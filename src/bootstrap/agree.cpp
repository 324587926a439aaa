// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/agree.hpp"

#include <algorithm>
#include <iterator>
#include <span>
#include <vector>

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

namespace {

// One value per line; a value never holds a newline (the callers format numbers and names).
std::string encode(std::span<const Setting> settings) {
  std::string s;
  for (const Setting& x : settings) s.append(x.value).push_back('\n');
  return s;
}

std::vector<std::string> decode(const Bytes& b) {
  std::vector<std::string> values;
  std::string v;
  for (std::byte c : b) {
    if (c == std::byte{'\n'}) {
      values.push_back(std::move(v));
      v.clear();
    } else {
      v.push_back(static_cast<char>(c));
    }
  }
  return values;
}

}  // namespace

std::string disagreements(Bootstrap& boot, std::span<const Setting> settings) {
  const std::string mine = encode(settings);
  const auto all = boot.all_gather(std::as_bytes(std::span(mine.data(), mine.size())));
  std::vector<std::vector<std::string>> values;
  values.reserve(all.size());
  for (const Bytes& b : all) values.push_back(decode(b));
  std::string out;
  for (std::size_t i = 0; i < settings.size(); ++i) {
    // Value -> ranks, in the order values first appear by rank.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (std::size_t r = 0; r < values.size(); ++r) {
      const std::string v = i < values[r].size() ? values[r][i] : "(not set)";
      auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == v; });
      if (it == groups.end()) {
        groups.push_back({v, {}});
        it = std::prev(groups.end());
      }
      it->second.push_back(static_cast<int>(r));
    }
    if (groups.size() < 2) continue;
    if (!out.empty()) out += "\n";
    out.append(settings[i].name).append(": ");
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (g > 0) out += "; ";
      out += groups[g].first + (groups[g].second.size() > 1 ? " on ranks " : " on rank ");
      for (std::size_t k = 0; k < groups[g].second.size(); ++k)
        out += (k > 0 ? ", " : "") + std::to_string(groups[g].second[k]);
    }
  }
  return out;
}

}  // namespace tpcomm
