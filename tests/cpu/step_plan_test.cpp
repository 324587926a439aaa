// SPDX-License-Identifier: Apache-2.0
// `tpcomm step`'s model files and the plan of one decode step's communication.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/step_plan.hpp"
#include "tpcomm/status.hpp"

#ifndef TPCOMM_SOURCE_DIR
#error "TPCOMM_SOURCE_DIR must name the source tree"
#endif

namespace tpcomm::tools {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kRoots{TPCOMM_SOURCE_DIR};

/// A temporary folder for model files, removed at the end.
class ModelFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tpcomm-step-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

  /// The message of the `Error` that loading `text` throws ("" when it loads).
  std::string refusal(const std::string& text) {
    const std::string path = write("model.json", text);
    try {
      (void)load_model_file(path);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      return e.what();
    }
    return {};
  }

  fs::path dir_;
};

nlohmann::json good() {
  return {{"name", "m"},        {"hidden_size", 64},   {"num_layers", 2},
          {"vocab_size", 1000}, {"dtype", "bfloat16"}, {"moe", false}};
}

TEST(StepModels, EveryPresetLoads) {
  const std::vector<std::string> names = list_models(kRoots);
  for (const char* want : {"deepseek-v3", "llama-3.1-70b", "qwen3-235b-a22b", "gpt-oss-120b"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const std::string& n : names) {
    const ModelSpec m = load_model_file(find_model(n, kRoots));
    EXPECT_FALSE(m.name.empty()) << n;
    EXPECT_EQ(m.dtype, DType::kBF16) << n;
  }
}

TEST(StepModels, PresetsHoldThePublishedShapes) {
  struct Row {
    const char* preset;
    const char* name;
    std::int64_t hidden, layers, vocab;
    bool moe;
    std::int64_t dense;
    int top_k;
    std::int64_t shared;
  };
  for (const Row& r : {Row{"deepseek-v3", "DeepSeek-V3", 7168, 61, 129280, true, 3, 8, 1},
                       Row{"llama-3.1-70b", "Llama-3.1-70B", 8192, 80, 128256, false, 0, 0, 0},
                       Row{"qwen3-235b-a22b", "Qwen3-235B-A22B", 4096, 94, 151936, true, 0, 8, 0},
                       Row{"gpt-oss-120b", "gpt-oss-120b", 2880, 36, 201088, true, 0, 4, 0}}) {
    const ModelSpec m = load_model_file(find_model(r.preset, kRoots));
    EXPECT_EQ(m.name, r.name);
    EXPECT_EQ(m.hidden, r.hidden) << r.preset;
    EXPECT_EQ(m.layers, r.layers) << r.preset;
    EXPECT_EQ(m.vocab, r.vocab) << r.preset;
    EXPECT_EQ(m.moe, r.moe) << r.preset;
    EXPECT_EQ(m.first_dense_layers, r.dense) << r.preset;
    EXPECT_EQ(m.top_k, r.top_k) << r.preset;
    EXPECT_EQ(m.shared_experts, r.shared) << r.preset;
  }
}

TEST(StepModels, NamesAreFoundInAnyCaseAndFilesByPath) {
  EXPECT_EQ(fs::path(find_model("DeepSeek-V3", kRoots)).filename(), "deepseek-v3.json");
  EXPECT_EQ(find_model("my/model", kRoots), "my/model");
  EXPECT_EQ(find_model("model.JSON", kRoots), "model.JSON");
  try {
    (void)find_model("gpt-5", kRoots);
    ADD_FAILURE() << "an unknown preset was found";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpt-5"), std::string::npos) << what;
    EXPECT_NE(what.find("deepseek-v3"), std::string::npos) << what;  // the presets are listed
  }
}

TEST(StepModels, DataRootsPutTheInstalledTreeFirst) {
  EXPECT_EQ(data_roots("/opt/tpcomm/bin", "/src/tpcomm"),
            (std::vector<std::string>{"/opt/tpcomm/bin/../share/tpcomm", "/opt/tpcomm/bin",
                                      "/src/tpcomm"}));
  EXPECT_EQ(data_roots("", ""), std::vector<std::string>{});
}

TEST_F(ModelFiles, AUserFileWithTheSameFieldsLoads) {
  nlohmann::json j = good();
  j["extra"] = "ignored";
  const std::string path = write("mine.json", j.dump());
  const ModelSpec m = load_model_file(find_model(path, kRoots));
  EXPECT_EQ(m.hidden, 64);
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.vocab, 1000);
  EXPECT_EQ(m.source, path);
}

TEST_F(ModelFiles, BadFilesAreRefusedNamingTheFileAndTheField) {
  struct Case {
    const char* field;
    nlohmann::json value;  // null: the field is removed
  };
  for (const Case& c :
       {Case{"name", nullptr},          Case{"name", 3},
        Case{"hidden_size", nullptr},   Case{"hidden_size", -4096},
        Case{"hidden_size", 0},         Case{"hidden_size", "4096"},
        Case{"hidden_size", 4096.5},    Case{"hidden_size", std::uint64_t{1} << 63},
        Case{"num_layers", nullptr},    Case{"num_layers", -1},
        Case{"num_layers", true},       Case{"vocab_size", nullptr},
        Case{"vocab_size", -129280},    Case{"vocab_size", nlohmann::json::array({1})},
        Case{"dtype", nullptr},         Case{"dtype", "float7"},
        Case{"dtype", "int32"},         Case{"dtype", 16},
        Case{"moe", nullptr},           Case{"moe", "yes"},
        Case{"first_dense_layers", -1}, Case{"first_dense_layers", 3}}) {
    nlohmann::json j = good();
    if (c.value.is_null())
      j.erase(c.field);
    else
      j[c.field] = c.value;
    const std::string what = refusal(j.dump());
    EXPECT_NE(what.find((dir_ / "model.json").string()), std::string::npos)
        << c.field << " " << c.value << ": " << what;
    EXPECT_NE(what.find(std::string("\"") + c.field + "\""), std::string::npos)
        << c.field << " " << c.value << ": " << what;
  }
}

TEST_F(ModelFiles, MoeFieldsAreCheckedAndNeedMoe) {
  nlohmann::json moe = good();
  moe["moe"] = true;
  moe["num_experts_per_tok"] = 8;
  const ModelSpec m = parse_model(moe, "test");
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.shared_experts, 0);  // optional
  struct Case {
    bool moe;
    const char* field;
    nlohmann::json value;  // null: the field is removed
  };
  for (const Case& c :
       {Case{true, "num_experts_per_tok", nullptr}, Case{true, "num_experts_per_tok", 0},
        Case{true, "num_experts_per_tok", kMaxModelTopK + 1},
        Case{true, "num_experts_per_tok", "8"}, Case{true, "n_shared_experts", -1},
        Case{true, "n_shared_experts", 1.5}, Case{false, "num_experts_per_tok", 8},
        Case{false, "n_shared_experts", 1}}) {
    nlohmann::json j = c.moe ? moe : good();
    if (c.value.is_null())
      j.erase(c.field);
    else
      j[c.field] = c.value;
    const std::string what = refusal(j.dump());
    EXPECT_NE(what.find(std::string("\"") + c.field + "\""), std::string::npos)
        << c.field << " " << c.value << ": " << what;
  }
}

TEST_F(ModelFiles, NotAModelIsRefusedNamingTheFile) {
  for (const char* text : {"", "{", "[1, 2]", "\"DeepSeek\"", "null"}) {
    const std::string what = refusal(text);
    EXPECT_NE(what.find((dir_ / "model.json").string()), std::string::npos) << text << ": " << what;
  }
  try {
    (void)load_model_file((dir_ / "missing.json").string());
    ADD_FAILURE() << "a missing file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
  }
}

// Files that would cost memory, never end, or overflow a number are refused first, naming the
// file and why.
TEST_F(ModelFiles, HostileFilesAreRefusedBeforeTheyCostAnything) {
  nlohmann::json j = good();
  std::string text = j.dump();
  text.replace(text.find("64"), 2, "1e400");
  std::string what = refusal(text);
  EXPECT_NE(what.find("model.json: not valid JSON in field \"hidden_size\""), std::string::npos)
      << what;
  EXPECT_NE(what.find("1e400"), std::string::npos) << what;

  what = refusal(std::string(100000, '['));
  EXPECT_NE(what.find("nested deeper than 8 levels"), std::string::npos) << what;

  what = refusal(std::string(kMaxModelFileBytes + 1, ' '));
  EXPECT_NE(what.find("a model file is at most 1048576 bytes"), std::string::npos) << what;

  const fs::path fifo = dir_ / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    (void)load_model_file(fifo.string());
    ADD_FAILURE() << "a FIFO loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fifo.json: not a regular file"), std::string::npos)
        << e.what();
  }
}

// A build tree has the presets in its share/ folder, and a program finds models/ beside it.
TEST_F(ModelFiles, PresetsAreFoundBesideTheProgram) {
  fs::create_directories(dir_ / "bin" / "models");
  std::ofstream(dir_ / "bin" / "models" / "tiny.json") << good().dump();
  const auto roots = data_roots((dir_ / "bin").string(), "");
  EXPECT_EQ(load_model_file(find_model("tiny", roots)).hidden, 64);
}

TEST(StepPlanTest, EveryPresetMatchesAHandTable) {
  // Computed by hand: act = tokens x hidden x 2 bytes; shard = ceil(vocab / tp); the LM head
  // takes [tokens x tp, shard] and gives [tokens, vocab], 2 bytes each.
  struct Row {
    const char* preset;
    int tp;
    std::int64_t tokens;
    std::int64_t attn, mlp, moe;  // reductions of each kind
    std::int64_t act_bytes;
    std::int64_t shard;
    std::int64_t head_in, head_out;
    std::int64_t step_in;  // 2L x act + head_in
    int top_k;             // of the MoE layers' combine
    bool shared;
  };
  for (const Row& r : {
           Row{"deepseek-v3", 8, 1, 61, 3, 58, 14336, 16160, 258560, 258560, 2007552, 8, true},
           Row{"deepseek-v3", 8, 128, 61, 3, 58, 1835008, 16160, 33095680, 33095680, 256966656, 8,
               true},
           Row{"llama-3.1-70b", 4, 8, 80, 80, 0, 131072, 32064, 2052096, 2052096, 23023616, 0,
               false},
           Row{"qwen3-235b-a22b", 8, 32, 94, 0, 94, 262144, 18992, 9723904, 9723904, 59006976, 8,
               false},
           Row{"gpt-oss-120b", 2, 128, 36, 0, 36, 737280, 100544, 51478528, 51478528, 104562688, 4,
               false},
           // A vocabulary that does not split evenly: the last shard is padded.
           Row{"gpt-oss-120b", 3, 1, 36, 0, 36, 5760, 67030, 402180, 402176, 816900, 4, false},
       }) {
    const ModelSpec m = load_model_file(find_model(r.preset, kRoots));
    const StepPlan p = plan_step(m, r.tp, r.tokens);
    SCOPED_TRACE(std::string(r.preset) + " tp " + std::to_string(r.tp) + " tokens " +
                 std::to_string(r.tokens));
    ASSERT_EQ(std::ssize(p.ops), 2 * m.layers + 1);
    EXPECT_EQ(p.count(StepOpKind::kAttnReduce), r.attn);
    EXPECT_EQ(p.count(StepOpKind::kMlpReduce), r.mlp);
    EXPECT_EQ(p.count(StepOpKind::kMoeReduce), r.moe);
    EXPECT_EQ(p.count(StepOpKind::kLmHead), 1);
    // Order: per layer the attention reduction, then the MLP's (dense layers first), then the
    // LM head.
    for (std::int64_t l = 0; l < m.layers; ++l) {
      const StepOp& a = p.ops[static_cast<std::size_t>(2 * l)];
      const StepOp& f = p.ops[static_cast<std::size_t>(2 * l + 1)];
      const StepOpKind ffn = l < r.mlp ? StepOpKind::kMlpReduce : StepOpKind::kMoeReduce;
      EXPECT_EQ(a,
                (StepOp{StepOpKind::kAttnReduce, l, r.tokens, m.hidden, r.act_bytes, r.act_bytes}));
      const bool moe = ffn == StepOpKind::kMoeReduce;
      EXPECT_EQ(f, (StepOp{ffn, l, r.tokens, m.hidden, r.act_bytes, r.act_bytes, moe ? r.top_k : 0,
                           moe && r.shared}));
    }
    EXPECT_EQ(p.ops.back(),
              (StepOp{StepOpKind::kLmHead, m.layers, r.tokens, r.shard, r.head_in, r.head_out}));
    EXPECT_EQ(p.in_bytes(), r.step_in);
  }
}

TEST(StepPlanTest, TheGpuTiersSmallModel) {
  const ModelSpec m =
      load_model_file(std::string(TPCOMM_SOURCE_DIR) + "/tests/data/tiny-model.json");
  const StepPlan p = plan_step(m, 4, 3);
  const std::vector<StepOp> want{
      {StepOpKind::kAttnReduce, 0, 3, 1000, 6000, 6000},
      {StepOpKind::kMlpReduce, 0, 3, 1000, 6000, 6000},
      {StepOpKind::kAttnReduce, 1, 3, 1000, 6000, 6000},
      {StepOpKind::kMoeReduce, 1, 3, 1000, 6000, 6000, 3, true},
      {StepOpKind::kAttnReduce, 2, 3, 1000, 6000, 6000},
      {StepOpKind::kMoeReduce, 2, 3, 1000, 6000, 6000, 3, true},
      // ceil(1001 / 4) = 251 columns per shard, the last one padded; 12 rows of them in.
      {StepOpKind::kLmHead, 3, 3, 251, 12 * 251 * 2, 3 * 1001 * 2},
  };
  EXPECT_EQ(p.ops, want);
}

TEST(StepPlanTest, OperationNames) {
  EXPECT_EQ(to_string(StepOpKind::kAttnReduce), "attn_reduce");
  EXPECT_EQ(to_string(StepOpKind::kMlpReduce), "mlp_reduce");
  EXPECT_EQ(to_string(StepOpKind::kMoeReduce), "moe_reduce");
  EXPECT_EQ(to_string(StepOpKind::kLmHead), "lm_head");
}

TEST(StepPlanTest, OutOfRangeSizesAreRefused) {
  const ModelSpec m = parse_model(good(), "test");
  EXPECT_THROW((void)plan_step(m, 0, 1), Error);
  EXPECT_THROW((void)plan_step(m, 65, 1), Error);
  EXPECT_THROW((void)plan_step(m, 2, 0), Error);
  EXPECT_THROW((void)plan_step(m, 2, (std::int64_t{1} << 20) + 1), Error);
  // The largest model and token count a run accepts: no byte count overflows.
  ModelSpec big = m;
  big.hidden = kMaxModelHidden;
  big.vocab = kMaxModelVocab;
  big.layers = kMaxModelLayers;
  const StepPlan p = plan_step(big, 1, std::int64_t{1} << 20);
  EXPECT_EQ(p.ops.back().out_bytes, (std::int64_t{1} << 20) * kMaxModelVocab * 2);
  EXPECT_GT(p.in_bytes(), 0);
}

}  // namespace
}  // namespace tpcomm::tools
