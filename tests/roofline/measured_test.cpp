#include "roofline/measured.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/model_config.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

class MeasuredTest : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& text) {
    const auto path = dir_ / "measured.json";
    std::ofstream(path) << text;
    return path;
  }
  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(MeasuredTest, ComparesPerCallTimesWithThePrediction) {
  const ModelSpec s =
      load_model_config(std::string(EKVA_FIXTURES) + "/configs/mixtral-8x7b/config.json");
  const HardwareSpec hw = find_hardware("h200");
  Workload base;
  base.batch = 8;
  base.context = 4096;
  const StepCost step = predict_step(s, hw, base);
  double layer0_attention = 0;
  for (const auto& r : step.operators) {
    if (r.layer == 0 &&
        (r.kind == OperatorKind::kAttentionScores || r.kind == OperatorKind::kAttentionValues)) {
      layer0_attention += r.time_s;
    }
  }
  Workload other = base;
  other.batch = 32;
  other.retained = KvRetention::fraction(s, 4096, 0.5);
  const double lm_head_32 = [&] {
    for (const auto& r : predict_step(s, hw, other).operators) {
      if (r.kind == OperatorKind::kLmHead) return r.time_s;
    }
    return 0.0;
  }();
  const auto path =
      write(fmt::format(R"({{
    "hardware": "h200",
    "measurements": [
      {{"operator": "attention", "time_s": {}}},
      {{"operator": "attention", "layer": 3, "time_s": {}}},
      {{"operator": "lm_head", "batch": 32, "kv_fraction": 0.5, "time_s": {}}},
      {{"operator": "step", "time_s": {}}}
    ]}})",
                        2 * layer0_attention, layer0_attention, lm_head_32, step.time_s / 2));
  const MeasuredTimes m = load_measured_times(path);
  EXPECT_EQ(m.hardware, "h200");
  const auto errors = compare_with_measured(s, hw, base, m, false);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_NEAR(errors[0].error, -0.5, 1e-9);  // the per-layer mean: every layer is alike here
  EXPECT_NEAR(errors[1].error, 0.0, 1e-9);
  EXPECT_NEAR(errors[2].error, 0.0, 1e-9);
  EXPECT_EQ(errors[2].workload.batch, 32);
  EXPECT_NEAR(errors[3].error, 1.0, 1e-9);

  // An operator the model lacks is an error, not a silent zero.
  const auto shared = write(R"({"measurements": [{"operator": "shared_expert", "time_s": 1e-5}]})");
  EXPECT_THROW(compare_with_measured(s, hw, base, load_measured_times(shared), false), Error);
  const auto layer =
      write(R"({"measurements": [{"operator": "router", "layer": 99, "time_s": 1}]})");
  EXPECT_THROW(compare_with_measured(s, hw, base, load_measured_times(layer), false), Error);
}

TEST_F(MeasuredTest, MalformedFilesAreRejected) {
  for (const char* text : {
           R"([])",
           R"({"measurements": [{"operator": "attention"}]})",
           R"({"measurements": [{"operator": "attention", "time_s": -1}]})",
           R"({"measurements": [{"operator": "mlp", "time_s": 1}]})",
           R"({"measurements": [{"operator": "attention", "time_s": 1, "batch": 0}]})",
           R"({"measurements": [{"operator": "attention", "time_s": 1, "kv_fraction": 2}]})",
           R"({"measurements": [{"operator": "attention", "time_s": 1, "kv_dtype": "fp6"}]})",
           R"({"measurements": [{"operator": "attention", "time_us": 1}]})",
           R"({"measurements": [], "gpu": "h200"})",
       }) {
    EXPECT_THROW(load_measured_times(write(text)), Error) << text;
  }
}

}  // namespace
}  // namespace ekva
