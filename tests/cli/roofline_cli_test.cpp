// `ekva roofline` end to end: the JSON interface, the plan, measured and chart options, errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "kv/budget_plan.h"
#include "support/run_ekva.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

const std::string kMixtralShape = std::string(EKVA_FIXTURES) + "/configs/mixtral-8x7b";

class RooflineCli : public ::testing::Test {
 protected:
  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(RooflineCli, JsonHasTheDocumentedFields) {
  const testing::CommandResult r =
      testing::run_ekva("roofline --model " + kMixtralShape +
                        "/config.json --hw h200 --batch 16 --context 4096 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"].get<double>(), 131072);
  EXPECT_EQ(j["active_params_per_token"].get<int64_t>(), 12879925248);
  EXPECT_NEAR(j["experts_touched_per_layer"].get<double>(), 7.91982, 1e-5);
  EXPECT_EQ(j["bound"], "memory");
  EXPECT_GT(j["flops"].get<double>(), 0);
  EXPECT_GT(j["bytes"].get<double>(), 0);
  EXPECT_TRUE(j["memory"]["fits"].get<bool>());
  EXPECT_GT(j["memory"]["max_batch"].get<int64_t>(), 16);
  ASSERT_EQ(j["operators"].size(), 32u * 9 + 3);
  double time = 0;
  for (const auto& op : j["operators"]) time += op["time_s"].get<double>();
  EXPECT_NEAR(time, j["time_s"].get<double>(), 1e-9 * time);
}

TEST_F(RooflineCli, PlanPrefillSvgAndMeasured) {
  const ModelSpec spec = load_model_config(kMixtralShape);
  const auto plan = dir_ / "plan.json";
  BudgetPlan::uniform(spec, 8, BudgetPlan::Unit::kFraction, 0.25).save(plan);
  const std::string base =
      "roofline --model " + kMixtralShape + " --hw h200 --batch 4 --context 4000";
  const auto full = nlohmann::json::parse(testing::run_ekva(base + " --json").out);
  const testing::CommandResult r = testing::run_ekva(base + " --json --plan " + plan.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto planned = nlohmann::json::parse(r.out);
  EXPECT_NEAR(planned["kv_bytes_per_sequence"].get<double>(),
              full["kv_bytes_per_sequence"].get<double>() / 4, 1.0);
  EXPECT_LT(planned["time_s"].get<double>(), full["time_s"].get<double>());

  const auto prefill =
      nlohmann::json::parse(testing::run_ekva(base + " --phase prefill --json").out);
  EXPECT_EQ(prefill["bound"], "compute");

  const auto svg = dir_ / "chart.svg";
  const auto measured = dir_ / "measured.json";
  std::ofstream(measured) << R"({"hardware": "h200", "measurements": [
      {"operator": "attention", "batch": 16, "context": 4096, "time_s": 5e-5}]})";
  const testing::CommandResult m =
      testing::run_ekva(base + " --svg " + svg.string() + " --measured " + measured.string());
  ASSERT_EQ(m.code, 0) << m.out;
  EXPECT_NE(m.out.find("mean absolute error"), std::string::npos) << m.out;
  std::ifstream in(svg);
  std::string head(4, ' ');
  in.read(head.data(), 4);
  EXPECT_EQ(head, "<svg");
}

TEST_F(RooflineCli, SearchReportsTheBudgetAndBatch) {
  const testing::CommandResult r =
      testing::run_ekva("roofline search --model " + kMixtralShape +
                        " --hw h200 --context 32768 --memory-cap-gib 141 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_FALSE(j["chosen"].is_null());
  EXPECT_EQ(j["chosen"]["kv_fraction"].get<double>(), 1.0);
  EXPECT_GT(j["points"].back()["batch"].get<int64_t>(), j["chosen"]["batch"].get<int64_t>());
}

TEST_F(RooflineCli, ServePredictsSequencesAndThroughputPerBudget) {
  const std::string base = "roofline serve --model " + kMixtralShape +
                           " --hw h200 --kv-memory 42949672960 --prompt-tokens 32704 "
                           "--max-tokens 64";
  const testing::CommandResult r = testing::run_ekva(base + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["capacity_pages"].get<int64_t>(), 40 * 131072);
  EXPECT_EQ(j["profile"], "measured");
  ASSERT_EQ(j["points"].size(), 4u);  // the default budgets 1, 0.5, 0.2, 0.1
  EXPECT_EQ(j["points"][0]["budget"].get<double>(), 1.0);
  EXPECT_EQ(j["points"][0]["sequences"].get<int64_t>(), 10);
  EXPECT_EQ(j["points"][0]["gain_over_full"].get<double>(), 1.0);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_GT(j["points"][i]["sequences"].get<int64_t>(),
              j["points"][i - 1]["sequences"].get<int64_t>());
    EXPECT_GT(j["points"][i]["tokens_per_s"].get<double>(),
              j["points"][i - 1]["tokens_per_s"].get<double>());
  }
  const testing::CommandResult text = testing::run_ekva(base + " --budgets 1,0.25");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("sequences"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("0.25"), std::string::npos) << text.out;

  const testing::CommandResult too_long =
      testing::run_ekva("roofline serve --model " + kMixtralShape +
                        " --hw h200 --kv-memory 1e10 --prompt-tokens 32768 --max-tokens 64");
  EXPECT_EQ(too_long.code, 1);
  EXPECT_NE(too_long.out.find("context of 32768"), std::string::npos) << too_long.out;
  const testing::CommandResult no_memory = testing::run_ekva(
      "roofline serve --model " + kMixtralShape + " --hw h200 --prompt-tokens 100");
  EXPECT_EQ(no_memory.code, 1);
  EXPECT_NE(no_memory.out.find("--kv-memory"), std::string::npos) << no_memory.out;
}

TEST_F(RooflineCli, BadInputsFailWithAMessage) {
  testing::CommandResult r =
      testing::run_ekva("roofline --model " + kMixtralShape + " --hw no-such-gpu --context 10");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("hardware 'no-such-gpu'"), std::string::npos) << r.out;
  const auto bad = dir_ / "bad.json";
  std::ofstream(bad) << R"({"name": "x", "kind": "gpu", "memory_gib": 0,
                           "memory_bandwidth_gbps": 1, "peak_tflops": {"fp32": 1}})";
  r = testing::run_ekva("roofline --model " + kMixtralShape + " --hw-file " + bad.string() +
                        " --context 10");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'memory_gib' must be a positive number"), std::string::npos) << r.out;
  r = testing::run_ekva("roofline --model " + kMixtralShape +
                        " --hw h200 --context 10 --kv-dtype fp6");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--kv-dtype"), std::string::npos) << r.out;
  r = testing::run_ekva("roofline search --model " + kMixtralShape + " --hw h200 --context 100");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("exactly one target"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ekva
