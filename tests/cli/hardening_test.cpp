// Hostile input end to end: every bad input ends in status 1 and a message naming the file, field
// or value (and the OS reason for OS errors), never a signal, and before any long work.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/repo_paths.h"
#include "support/run_ekva.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

const std::string kHeldoutText =
    (testing::kRepoRoot / "data/calibration/heldout-calibration.txt").string();

class HardeningCli : public ::testing::Test {
 protected:
  // Runs ekva, which must exit 1 with `needle` in its output.
  void expect_failure(const std::string& args, const std::string& needle) {
    const testing::CommandResult r = testing::run_ekva(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << "\n" << r.out;
  }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path.string();
  }

  testing::TempDir temp_;
  const fs::path& dir_ = temp_.path();
};

TEST_F(HardeningCli, UsageErrorsExitOne) {
  expect_failure("info", "--model is required");
  expect_failure("no-such-command", "");
  expect_failure("tokenize --tokenizer x --no-such-flag", "");
  EXPECT_EQ(testing::run_ekva("--help").code, 0);
  EXPECT_EQ(testing::run_ekva("--version").code, 0);
}

TEST_F(HardeningCli, FilesystemErrorsNameThePathAndTheReason) {
  fs::create_symlink("loop", dir_ / "loop");
  expect_failure("info --model " + (dir_ / "loop").string(), "Too many levels of symbolic links");
  expect_failure("tokenize --tokenizer " + (dir_ / "loop").string(),
                 "Too many levels of symbolic links");
  expect_failure("info --model " + (dir_ / std::string(5000, 'm')).string(), "File name too long");
  fs::create_directories(dir_ / "model" / "config.json");
  expect_failure("info --model " + (dir_ / "model").string(), "is a directory");
}

TEST_F(HardeningCli, OutputLocationsAreCheckedBeforeTheWork) {
  // The model does not exist: the output location must be refused before it is looked for.
  const std::string file = write("results", "x");
  expect_failure("eval --model " + (dir_ / "absent").string() + " --out " + file,
                 file + ": cannot write: " + file + " is not a directory");
  expect_failure("eval --model " + (dir_ / "absent").string() + " --out " + file + "/sub",
                 "is not a directory");
  expect_failure(
      "calibrate --model " + (dir_ / "absent").string() + " --data " + kHeldoutText + " --out " +
          (dir_ / "missing/stats.json").string(),
      "stats.json: cannot write: " + (dir_ / "missing").string() + " is not a directory");
  expect_failure("calibrate --model " + (dir_ / "absent").string() + " --data " + kHeldoutText +
                     " --out " + dir_.string(),
                 "cannot write: it is a directory");
  EXPECT_FALSE(fs::exists(dir_ / "missing"));
}

TEST_F(HardeningCli, CalibrateNamesWhatIsWrongWithItsData) {
  const std::string out = (dir_ / "stats.json").string();
  expect_failure("calibrate --model " + testing::kEmbeddedModel + " --data " + kHeldoutText +
                     " --tokens 100 --chunk 256 --out " + out,
                 "--tokens 100 is fewer than one --chunk of 256");
  expect_failure(
      "calibrate --model " + testing::kEmbeddedModel + " --data " + dir_.string() + " --out " + out,
      dir_.string() + ": is a directory, not a file");
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(HardeningCli, DeeplyNestedJsonInEveryFileOption) {
  const std::string deep = write("deep.json", std::string(300000, '['));
  const std::string nested_rope =
      write("config.json", R"({"model_type": "mixtral", "rope_parameters": {"x": )" +
                               std::string(300000, '[') + std::string(300000, ']') + "}}");
  const std::string config =
      (testing::kRepoRoot / "tests/fixtures/configs/mixtral-8x7b/config.json").string();
  const std::string roofline = "roofline --model " + config + " --batch 1 --context 128 ";
  expect_failure("roofline --model " + nested_rope + " --hw h200 --batch 1 --context 128",
                 "config.json: JSON nested deeper than 64 levels");
  expect_failure(roofline + "--hw-file " + deep, "nested deeper than 64 levels");
  expect_failure(roofline + "--hw h200 --measured " + deep, "nested deeper than 64 levels");
  expect_failure(roofline + "--hw h200 --routing " + deep, "nested deeper than 64 levels");
  expect_failure(roofline + "--hw h200 --plan " + deep, "nested deeper than 64 levels");
  expect_failure("plan --stats " + deep + " --budget 0.2 --out " + (dir_ / "p.json").string(),
                 "nested deeper than 64 levels");
}

TEST_F(HardeningCli, CalibrationStatisticsOutOfRangeAreRefused) {
  const nlohmann::json stats = nlohmann::json::parse(
      std::ifstream(testing::kRepoRoot / "fuzz/corpus/calibration_stats/stats.json"));
  const std::string plan = " --budget 0.2 --out " + (dir_ / "plan.json").string();
  EXPECT_EQ(testing::run_ekva("plan --stats " + write("ok.json", stats.dump()) + plan).code, 0);
  nlohmann::json bad = stats;
  bad["retention_sum"][0] = -1.0;
  expect_failure("plan --stats " + write("negative.json", bad.dump()) + plan,
                 "negative.json: retention_sum[0] is -1; it must be finite and not negative");
  bad = stats;
  bad["retention_sum"][1] = 1e308;
  expect_failure("plan --stats " + write("huge.json", bad.dump()) + plan,
                 "huge.json: layer 0 KV head 0 expert 0 holds more attention than its 4 queries "
                 "saw");
  bad = stats;
  bad["model"]["num_layers"] = 4294967298;
  expect_failure("plan --stats " + write("layers.json", bad.dump()) + plan,
                 "layers.json: 'num_layers' must be an integer in [1, 1024]");
}

TEST_F(HardeningCli, OversizedOrNonFiniteValuesAreRefused) {
  const std::string config =
      (testing::kRepoRoot / "tests/fixtures/configs/mixtral-8x7b/config.json").string();
  const std::string roofline = "roofline --model " + config + " --hw h200 --batch 1 --context 128";
  expect_failure(roofline + " --workspace-gib nan", "memory options must be finite");
  expect_failure(roofline + " --workspace-gib inf", "memory options must be finite");
  const std::string huge = write(
      "huge.json", R"({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 2147483647, "num_attention_heads": 2147483647,
        "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "max_position_embeddings": 32768})");
  expect_failure("roofline --model " + huge + " --hw h200 --batch 1 --context 128",
                 "field 'num_hidden_layers' must be in [1, 1024], got 2147483647");
  const std::string plan =
      write("plan.json",
            R"({"format": "ekva.budget_plan", "version": 1, "model": {"model_type": "mixtral",
        "num_layers": 2147483647, "num_kv_heads": 2147483647, "num_experts": 8}, "num_groups": 1,
        "unit": "fraction", "sink_tokens": 0, "recent_tokens": 0, "budgets": []})");
  expect_failure(roofline + " --plan " + plan,
                 "plan.json: field 'num_layers' must be an integer in [0, 1024]");
  nlohmann::json groups = nlohmann::json::parse(
      std::ifstream(testing::kRepoRoot / "fuzz/corpus/budget_plan/small.json"));
  groups["expert_groups"][0][1] = 4294967297;  // read as 1 when narrowed to 32 bits
  expect_failure(
      "roofline --model " + (testing::kRepoRoot / "tests/fixtures/hf-tiny/tiny-mixtral").string() +
          " --hw h200 --batch 1 --context 128 --plan " + write("groups.json", groups.dump()),
      "groups.json: expert_groups[0][1] names group 4294967297, not one in [0, 2)");
  expect_failure("tasks --task passkey --context 16777216 --tokenizer " + testing::kEmbeddedModel +
                     " --out " + (dir_ / "t.jsonl").string(),
                 "--context");
}

}  // namespace
}  // namespace ekva
