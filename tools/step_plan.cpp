// SPDX-License-Identifier: Apache-2.0
#include "tools/step_plan.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tpcomm/status.hpp"

namespace tpcomm::tools {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const std::string& source, const std::string& what) {
  throw Error(Status::kInvalidArgument, source + ": " + what);
}

const nlohmann::json& field(const nlohmann::json& j, const std::string& source, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) refuse(source, std::string("missing field \"") + name + "\"");
  return *it;
}

/// An integer field within [lo, hi].
std::int64_t int_field(const nlohmann::json& j, const std::string& source, const char* name,
                       std::int64_t lo, std::int64_t hi) {
  const nlohmann::json& v = field(j, source, name);
  if (!v.is_number_integer())
    refuse(source, std::string("field \"") + name + "\" must be an integer, not " + v.dump());
  // Unsigned values above INT64_MAX are out of range too.
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi))
    refuse(source, std::string("field \"") + name + "\" must be at most " + std::to_string(hi) +
                       ", not " + v.dump());
  const auto x = v.get<std::int64_t>();
  if (x < lo || x > hi)
    refuse(source, std::string("field \"") + name + "\" must be from " + std::to_string(lo) +
                       " to " + std::to_string(hi) + ", not " + v.dump());
  return x;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

ModelSpec parse_model(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) refuse(source, "a model is a JSON object, not " + std::string(j.type_name()));
  ModelSpec m;
  m.source = source;
  const nlohmann::json& name = field(j, source, "name");
  if (!name.is_string() || name.get<std::string>().empty())
    refuse(source, "field \"name\" must be a non-empty string, not " + name.dump());
  m.name = name.get<std::string>();
  m.hidden = int_field(j, source, "hidden_size", 1, kMaxModelHidden);
  m.layers = int_field(j, source, "num_layers", 1, kMaxModelLayers);
  m.vocab = int_field(j, source, "vocab_size", 1, kMaxModelVocab);
  const nlohmann::json& dtype = field(j, source, "dtype");
  const auto t = dtype.is_string() ? parse_dtype(dtype.get<std::string>()) : std::nullopt;
  if (!t || (*t != DType::kBF16 && *t != DType::kF16))
    refuse(source, "field \"dtype\" must be \"bfloat16\" or \"half\", not " + dtype.dump());
  m.dtype = *t;
  const nlohmann::json& moe = field(j, source, "moe");
  if (!moe.is_boolean()) refuse(source, "field \"moe\" must be true or false, not " + moe.dump());
  m.moe = moe.get<bool>();
  if (j.contains("first_dense_layers")) {
    m.first_dense_layers = int_field(j, source, "first_dense_layers", 0, m.layers);
    if (!m.moe && m.first_dense_layers != 0)
      refuse(source, "field \"first_dense_layers\" needs \"moe\": true");
  }
  if (m.moe) {
    m.top_k = static_cast<int>(int_field(j, source, "num_experts_per_tok", 1, kMaxModelTopK));
    if (j.contains("n_shared_experts"))
      m.shared_experts = int_field(j, source, "n_shared_experts", 0, kMaxModelSharedExperts);
  } else {
    for (const char* name : {"num_experts_per_tok", "n_shared_experts"})
      if (j.contains(name))
        refuse(source, std::string("field \"") + name + "\" needs \"moe\": true");
  }
  return m;
}

ModelSpec load_model_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) refuse(path, "no such model file");
  // A FIFO or a device would block or never end: only regular files are read.
  if (!fs::is_regular_file(st)) refuse(path, "not a regular file");
  const auto size = fs::file_size(path, ec);
  if (ec) refuse(path, "cannot be read");
  if (size > kMaxModelFileBytes)
    refuse(path, "a model file is at most " + std::to_string(kMaxModelFileBytes) +
                     " bytes; this one has " + std::to_string(size));
  std::ifstream f(path);
  if (!f) refuse(path, "cannot be read");
  std::stringstream text;
  text << f.rdbuf();
  nlohmann::json j;
  // The key whose value is being read, so that a number out of range names its field.
  std::string key;
  try {
    // A model is a flat object: deep nesting is refused as it is read, before it takes memory.
    j = nlohmann::json::parse(text.str(), [&](int depth, nlohmann::json::parse_event_t event,
                                              nlohmann::json& parsed) {
      if (depth > kMaxModelDepth)
        refuse(path,
               "not a model: nested deeper than " + std::to_string(kMaxModelDepth) + " levels");
      using Event = nlohmann::json::parse_event_t;
      if (event == Event::key) {
        key = parsed.get<std::string>();
      } else if (event == Event::value || event == Event::object_end || event == Event::array_end) {
        key.clear();
      }
      return true;
    });
  } catch (const nlohmann::json::out_of_range& e) {
    // A number out of range ("1e400"): its field, when it has one.
    refuse(path, std::string("not valid JSON") +
                     (key.empty() ? std::string() : " in field \"" + key + "\"") + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse(path, std::string("not valid JSON: ") + e.what());
  }
  return parse_model(j, path);
}

std::vector<std::string> data_roots(const std::string& exe_dir, const std::string& source_dir) {
  std::vector<std::string> out;
  if (!exe_dir.empty()) {
    out.push_back((fs::path(exe_dir) / ".." / "share" / "tpcomm").string());
    out.push_back(exe_dir);  // models/ beside the program (a build tree carried elsewhere)
  }
  if (!source_dir.empty()) out.push_back(source_dir);
  return out;
}

std::vector<std::string> list_models(const std::vector<std::string>& roots) {
  std::vector<std::string> names;
  for (const std::string& root : roots) {
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(root) / "models", ec), end; !ec && it != end;
         it.increment(ec))
      if (it->path().extension() == ".json") names.push_back(it->path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::string find_model(const std::string& name_or_file, const std::vector<std::string>& roots) {
  if (name_or_file.empty()) refuse("--model", "empty model name");
  const bool is_file =
      name_or_file.find('/') != std::string::npos ||
      (name_or_file.size() > 5 && lower(name_or_file.substr(name_or_file.size() - 5)) == ".json");
  if (is_file) return name_or_file;
  const std::string want = lower(name_or_file);
  for (const std::string& root : roots) {
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(root) / "models", ec), end; !ec && it != end;
         it.increment(ec))
      if (it->path().extension() == ".json" && lower(it->path().stem().string()) == want)
        return it->path().string();
  }
  std::string known;
  for (const std::string& n : list_models(roots)) known += (known.empty() ? "" : ", ") + n;
  std::string where;
  for (const std::string& r : roots) where += (where.empty() ? "" : ", ") + r + "/models";
  refuse("--model", "no preset named \"" + name_or_file +
                        "\" (presets: " + (known.empty() ? "none found" : known) + "; looked in " +
                        (where.empty() ? "nowhere" : where) + "); or give a FILE.json");
}

std::string_view to_string(StepOpKind k) noexcept {
  switch (k) {
    case StepOpKind::kAttnReduce:
      return "attn_reduce";
    case StepOpKind::kMlpReduce:
      return "mlp_reduce";
    case StepOpKind::kMoeReduce:
      return "moe_reduce";
    case StepOpKind::kLmHead:
      return "lm_head";
  }
  return "unknown";
}

Op operation(StepOpKind k) noexcept {
  switch (k) {
    case StepOpKind::kAttnReduce:
    case StepOpKind::kMlpReduce:
      return Op::kAllReduceAddRmsNorm;
    case StepOpKind::kMoeReduce:
      return Op::kMoeFinalize;
    case StepOpKind::kLmHead:
      return Op::kLmHeadExchange;
  }
  return Op::kAllReduce;
}

std::int64_t StepPlan::in_bytes() const noexcept {
  std::int64_t sum = 0;
  for (const StepOp& op : ops) sum += op.in_bytes;
  return sum;
}

std::int64_t StepPlan::count(StepOpKind k) const noexcept {
  return std::count_if(ops.begin(), ops.end(), [k](const StepOp& op) { return op.kind == k; });
}

StepPlan plan_step(const ModelSpec& model, int tp, std::int64_t tokens) {
  if (tp < 1 || tp > 64) refuse("--tp", "must be from 1 to 64, not " + std::to_string(tp));
  if (tokens < 1 || tokens > (std::int64_t{1} << 20))
    refuse("--tokens", "must be from 1 to 1048576, not " + std::to_string(tokens));
  StepPlan p{model, tp, tokens, {}};
  const auto es = static_cast<std::int64_t>(dtype_size(model.dtype));
  const std::int64_t act = tokens * model.hidden * es;
  p.ops.reserve(static_cast<std::size_t>(2 * model.layers + 1));
  for (std::int64_t l = 0; l < model.layers; ++l) {
    p.ops.push_back({StepOpKind::kAttnReduce, l, tokens, model.hidden, act, act});
    if (model.moe && l >= model.first_dense_layers)
      p.ops.push_back({StepOpKind::kMoeReduce, l, tokens, model.hidden, act, act, model.top_k,
                       model.shared_experts > 0});
    else
      p.ops.push_back({StepOpKind::kMlpReduce, l, tokens, model.hidden, act, act});
  }
  const std::int64_t shard = (model.vocab + tp - 1) / tp;
  p.ops.push_back({StepOpKind::kLmHead, model.layers, tokens, shard, tokens * tp * shard * es,
                   tokens * model.vocab * es});
  return p;
}

}  // namespace tpcomm::tools
