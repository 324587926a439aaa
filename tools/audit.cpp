// SPDX-License-Identifier: Apache-2.0
#include "tools/audit.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace tpcomm::tools {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Times {
  std::vector<double> us;
  std::string path;
};

}  // namespace

bool audited_algo(const std::string& algo) noexcept {
  return algo != "nccl_direct" && algo != "memcpy" && algo != "allreduce" &&
         algo != "allreduce_add_rmsnorm";
}

std::vector<AuditPoint> audit_points(const nlohmann::json& rows) {
  // (op, world, size) -> algo -> times, in the rows' order of first appearance.
  using Key = std::tuple<std::string, int, std::int64_t>;
  std::map<Key, std::vector<std::pair<std::string, Times>>> points;
  std::vector<Key> order;
  for (const nlohmann::json& r : rows) {
    const std::string algo = r.value("algo", "");
    if (!audited_algo(algo)) continue;
    const nlohmann::json col = r.value("out_of_place", nlohmann::json());
    if (!col.is_object() || !col.contains("time_us")) continue;
    const Key key{r.value("op", ""), r.value("world_size", 0), r.value("size", std::int64_t{0})};
    auto [it, added] = points.try_emplace(key);
    if (added) order.push_back(key);
    auto& algos = it->second;
    auto a =
        std::find_if(algos.begin(), algos.end(), [&](const auto& p) { return p.first == algo; });
    if (a == algos.end())
      a = algos.insert(algos.end(), {algo, Times{{}, r.value("served_by", "")}});
    a->second.us.push_back(col["time_us"].get<double>());
  }
  std::vector<AuditPoint> out;
  for (const Key& key : order) {
    const auto& algos = points[key];
    const auto builtin =
        std::find_if(algos.begin(), algos.end(), [](const auto& p) { return p.first == "auto"; });
    if (builtin == algos.end()) continue;
    AuditPoint p{std::get<0>(key),
                 std::get<2>(key),
                 std::get<1>(key),
                 builtin->second.path,
                 median(builtin->second.us),
                 "auto",
                 builtin->second.path,
                 0,
                 false};
    p.best_us = p.builtin_us;
    for (const auto& [algo, t] : algos) {
      const double us = median(t.us);
      if (us < p.best_us) {
        p.best_us = us;
        p.best_algo = algo;
        p.best_path = t.path;
      }
    }
    // The same path pinned is the same kernel and shape: what separates them is noise.
    p.loss = p.best_path != p.builtin_path &&
             p.builtin_us - p.best_us > std::max(kAuditMarginRatio * p.best_us, kAuditMarginUs);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<AuditPoint> audit_losses(const nlohmann::json& rows) {
  std::vector<AuditPoint> out = audit_points(rows);
  std::erase_if(out, [](const AuditPoint& p) { return !p.loss; });
  return out;
}

}  // namespace tpcomm::tools
