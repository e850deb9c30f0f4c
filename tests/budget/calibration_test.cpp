#include "budget/calibration.h"

#include <gtest/gtest.h>

#include <tuple>

#include "budget/allocator.h"
#include "core/error.h"
#include "engine/generate.h"
#include "kv/policy.h"

namespace ekva {
namespace {

std::vector<std::vector<int32_t>> chunks(int count, int length) {
  std::vector<std::vector<int32_t>> c(count, std::vector<int32_t>(length));
  for (int i = 0; i < count; ++i)
    for (int t = 0; t < length; ++t) c[i][t] = 3 + (t * 31 + i * 17 + (t * t) % 13) % 200;
  return c;
}

TEST(Calibration, StatisticsAreConsistentOnARealModel) {
  const auto model = Model::load(std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-qwen3_moe");
  const ModelSpec& s = model->spec();
  CalibrationOptions o;
  o.chunk_tokens = 128;
  o.ablation = true;
  const CalibrationStats st = calibrate(*model, chunks(2, 128), o);
  EXPECT_EQ(st.tokens, 256);
  EXPECT_GT(st.base_loss, 0.0);
  for (int l = 0; l < s.num_layers; ++l) {
    double primary = 0, topk = 0;
    for (int e = 0; e < s.num_experts; ++e) {
      primary += st.routing_primary[st.le(l, e)];
      topk += st.routing_topk[st.le(l, e)];
      EXPECT_TRUE(std::isfinite(st.loss_contribution[st.le(l, e)]));
    }
    EXPECT_EQ(primary, 256);
    EXPECT_EQ(topk, 256 * s.top_k);
    for (int h = 0; h < s.num_kv_heads; ++h) {
      double all_mass = 0, share = 0;
      for (int e = 0; e < s.num_experts; ++e) {
        for (size_t g = 1; g < st.grid.size(); ++g) {
          EXPECT_GE(st.retention(l, h, e, g) + 1e-12,
                    st.retention(l, h, e, g - 1));  // more budget keeps more
        }
        all_mass += st.retention(l, h, e, st.grid.size() - 1);
        share += st.key_share(l, h, e);
        EXPECT_GE(st.mean_entropy(l, h, e), 0.0);
      }
      EXPECT_NEAR(all_mass, 1.0, 1e-4);  // every key kept: all of the attention mass
      EXPECT_NEAR(share, 1.0, 1e-9);
    }
  }
  // Round trip through JSON, then a plan that policy ekva accepts for this model.
  const CalibrationStats back = CalibrationStats::from_json(st.to_json(), "stats");
  EXPECT_EQ(back.to_json(), st.to_json());
  PlanOptions po;
  po.budget = 0.25;
  po.groups = 4;
  PolicyOptions policy;
  policy.name = "ekva";
  policy.budget = 0.25;
  policy.plan = make_plan(back, po);
  Engine engine(*model, {}, policy);
  GenerateOptions g;
  g.max_new_tokens = 8;
  const GenerateResult r = generate(engine, chunks(1, 200)[0], g);
  EXPECT_LT(r.retained_tokens, r.total_tokens / 2);
}

TEST(Calibration, RejectsMalformedStats) {
  nlohmann::json j = {{"format", "something"}};
  EXPECT_THROW(CalibrationStats::from_json(j, "x.json"), Error);
  j = nlohmann::json::parse(R"({"format": "ekva.calibration_stats", "version": 1})");
  try {
    CalibrationStats::from_json(j, "x.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos);
  }
}

// Found by fuzz_calibration_stats (tests/fixtures/fuzz-regressions/calibration_stats/): a float
// where an integer belongs was converted, which is undefined when it is out of range; now it is
// refused.
TEST(Calibration, IntegerFieldsRefuseFloatsAndOutOfRangeValues) {
  const auto model = Model::load(std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-qwen3_moe");
  CalibrationOptions o;
  o.chunk_tokens = 32;
  const CalibrationStats st = calibrate(*model, chunks(1, 32), o);
  using Case = std::tuple<std::string, nlohmann::json, std::string>;
  for (const auto& [key, value, needle] :
       std::vector<Case>{{"tokens", 5.1e33, "'tokens' must be an integer"},
                         {"tokens", -1, "'tokens' must be an integer"},
                         {"moe", nlohmann::json::array({6.7e10}), "'moe' entries must be 0 or 1"},
                         {"moe", nlohmann::json::array({2}), "'moe' entries must be 0 or 1"},
                         {"moe", "x", "'moe' must be an array"}}) {
    SCOPED_TRACE(key + " = " + value.dump());
    nlohmann::json j = st.to_json();
    j[key] = value;
    try {
      CalibrationStats::from_json(j, "x.json");
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ekva
