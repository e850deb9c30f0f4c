#include "budget/allocator.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/policy.h"
#include "model/model.h"

namespace ekva {
namespace {

// One layer, one KV head, two experts with hand-made retention curves (per observation query):
// expert 0 holds 0.6 of the attention mass in its best 10% of the context; expert 1 spreads 0.4
// evenly.
CalibrationStats two_expert_stats() {
  CalibrationStats s;
  s.model_type = "mixtral";
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.num_experts = 2;
  s.grid = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0};
  s.chunk_tokens = 1000;
  s.tokens = 1000;
  s.chunks = 1;
  s.moe = {1};
  s.routing_primary = {100, 300};
  s.routing_topk = {200, 400};
  s.gate_mass = {50, 150};
  s.output_norm = {1, 1};
  s.coroute = {0, 100, 100, 0};
  s.entropy_sum = {2.0 * 100, 1.0 * 300};  // mean entropies 2 and 1
  s.entropy_count = {100, 300};
  s.key_share_sum = {0.5, 0.5};
  s.queries = {1};
  for (double g : s.grid) s.retention_sum.push_back(0.6 * std::min(1.0, g / 0.1));
  for (double g : s.grid) s.retention_sum.push_back(0.4 * g);
  // retention_sum is [layer][head][expert][grid]: expert 0's curve first, then expert 1's.
  return s;
}

TEST(Allocator, GreedyFindsTheKnownOptimum) {
  PlanOptions o;
  o.allocator = Allocator::kGreedy;
  o.budget = 0.2;
  const BudgetPlan plan = make_plan(two_expert_stats(), o);
  // Expert 0's curve pays 6 per unit of budget up to 0.1, then nothing; expert 1's pays 0.4
  // throughout.
  EXPECT_NEAR(plan.budget(0, 0, 0), 0.1, 1e-9);
  EXPECT_NEAR(plan.budget(0, 0, 1), 0.1, 1e-9);
  EXPECT_NEAR(plan.provenance["predicted_retained_mass"].get<double>(), 0.6 + 0.04, 1e-9);
}

TEST(Allocator, BudgetsSumExactlyAndRespectFloors) {
  for (const Allocator a : {Allocator::kUniform, Allocator::kProportional, Allocator::kGreedy}) {
    PlanOptions o;
    o.allocator = a;
    o.budget = 0.2;
    o.floor = 0.08;
    const BudgetPlan plan = make_plan(two_expert_stats(), o);
    EXPECT_NEAR(plan.budget(0, 0, 0) + plan.budget(0, 0, 1), 0.2, 1e-12) << allocator_name(a);
    EXPECT_GE(plan.budget(0, 0, 0), 0.08 - 1e-12);
    EXPECT_GE(plan.budget(0, 0, 1), 0.08 - 1e-12);
  }
  PlanOptions o;
  o.budget = 0.2;
  o.floor = 0.15;  // two groups x 0.15 > 0.2
  EXPECT_THROW(make_plan(two_expert_stats(), o), Error);
}

TEST(Allocator, ProportionalFollowsEntropyTimesLogCount) {
  PlanOptions o;
  o.allocator = Allocator::kProportional;
  o.budget = 0.3;
  const BudgetPlan plan = make_plan(two_expert_stats(), o);
  const double w0 = 2.0 * std::log1p(100), w1 = 1.0 * std::log1p(300);
  EXPECT_NEAR(plan.budget(0, 0, 0), 0.3 * w0 / (w0 + w1), 1e-12);
  EXPECT_NEAR(plan.budget(0, 0, 1), 0.3 * w1 / (w0 + w1), 1e-12);
}

TEST(Allocator, TokenBudgetsAndDeterminism) {
  PlanOptions o;
  o.budget = 200;  // tokens, read against the 1000-token calibration chunks
  const BudgetPlan a = make_plan(two_expert_stats(), o), b = make_plan(two_expert_stats(), o);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.unit(), BudgetPlan::Unit::kTokens);
  EXPECT_NEAR(a.budget(0, 0, 0), 100, 1e-6);
  EXPECT_NEAR(a.retained_tokens(0, 0, 5000), 200, 1e-6);
}

TEST(Allocator, CoroutingGroupsMergeTheLeastRoutedIntoItsPartner) {
  CalibrationStats s = two_expert_stats();
  s.num_experts = 4;
  s.routing_topk = {100, 10, 80, 90};
  s.coroute.assign(16, 0.0);
  auto pair = [&](int a, int b, double n) { s.coroute[a * 4 + b] = s.coroute[b * 4 + a] = n; };
  pair(1, 2, 9);  // expert 1 (least routed) mostly co-routes with 2
  pair(1, 0, 1);
  pair(0, 3, 50);
  const std::vector<int> g = coroute_groups(s, 0, 3);
  EXPECT_EQ(g[1], g[2]);
  EXPECT_NE(g[0], g[1]);
  EXPECT_NE(g[3], g[1]);
  const std::vector<int> two =
      coroute_groups(s, 0, 2);  // then {1,2} (mass 90) is smallest... with 3 (90)
  EXPECT_EQ(two[1], two[2]);
  EXPECT_THROW(coroute_groups(s, 0, 5), Error);
}

TEST(Allocator, PlanForOneModelIsRefusedForAnother) {
  const BudgetPlan plan = make_plan(two_expert_stats(), PlanOptions{});
  const auto qwen = Model::load(std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-qwen2_moe");
  PolicyOptions o;
  o.name = "ekva";
  o.plan = plan;
  EXPECT_THROW(KvPolicy(o, qwen->spec()), Error);
  EXPECT_THROW(two_expert_stats().check_model(qwen->spec()), Error);
}

TEST(Allocator, UnknownNamesAreErrors) {
  EXPECT_THROW(parse_allocator("best"), Error);
  EXPECT_THROW(parse_scope("global"), Error);
  EXPECT_EQ(parse_scope("expert"), PlanScope::kExpert);
}

}  // namespace
}  // namespace ekva
