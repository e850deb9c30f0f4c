#include "kv/kv_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace ekva {
namespace {

ModelSpec shape() {
  ModelSpec s;
  s.model_type = "mixtral";
  s.num_layers = 3;
  s.num_kv_heads = 2;
  s.num_heads = 4;
  s.head_dim = 8;
  s.num_experts = 4;
  s.top_k = 2;
  s.max_position = 1000;
  return s;
}

int sum(const std::vector<int>& v) {
  return std::accumulate(v.begin(), v.end(), 0);
}

TEST(KvBudget, WithoutAPlanEveryHeadKeepsTheMean) {
  const ModelSpec s = shape();
  const KvBudgets fraction = resolve_budgets(s, nullptr, 0.25, 200);
  EXPECT_EQ(fraction.head, std::vector<int>(6, 50));
  EXPECT_EQ(resolve_budgets(s, nullptr, 64.0, 200).head, std::vector<int>(6, 64));
  EXPECT_EQ(resolve_budgets(s, nullptr, std::nullopt, 200).head, std::vector<int>(6, 200));
  EXPECT_EQ(fraction.sinks + fraction.recent, 0);
}

// A budget past what int can hold, or past the context, keeps the context: it never wraps.
TEST(KvBudget, HugeBudgetsClampToTheContext) {
  const ModelSpec s = shape();
  EXPECT_EQ(resolve_budgets(s, nullptr, 3e9, 200).head, std::vector<int>(6, 1000));
  EXPECT_EQ(resolve_budgets(s, nullptr, 1e300, 200).head, std::vector<int>(6, 1000));
  EXPECT_EQ(resolve_budgets(s, nullptr, 1e-9, 200).head, std::vector<int>(6, 1));
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()})
    EXPECT_THROW(resolve_budgets(s, nullptr, bad, 200), Error) << bad;
}

TEST(KvBudget, APlanAloneKeepsItsOwnBudgetsAndItsSinksAndRecentOnTop) {
  const ModelSpec s = shape();
  BudgetPlan plan = BudgetPlan::uniform(s, 4, BudgetPlan::Unit::kFraction, 0.25);
  plan.sink_tokens = 4;
  plan.recent_tokens = 16;
  const KvBudgets b = resolve_budgets(s, &plan, std::nullopt, 400);
  EXPECT_EQ(b.head, std::vector<int>(6, 100));
  EXPECT_EQ(b.sinks, 4);
  EXPECT_EQ(b.recent, 16);
}

TEST(KvBudget, ABudgetRescalesThePlansShares) {
  const ModelSpec s = shape();
  BudgetPlan plan = BudgetPlan::uniform(s, 1, BudgetPlan::Unit::kTokens, 10);
  plan.set_budget(0, 0, 0, 30);  // three times the others' share
  const KvBudgets alone = resolve_budgets(s, &plan, std::nullopt, 500);
  EXPECT_EQ(alone.head, (std::vector<int>{30, 10, 10, 10, 10, 10}));
  const KvBudgets scaled = resolve_budgets(s, &plan, 80.0, 500);  // mean 80 tokens per head
  EXPECT_EQ(sum(scaled.head), 80 * 6);
  EXPECT_EQ(scaled.head[0], 180);
  EXPECT_EQ(scaled.head[0], 3 * scaled.head[1]);
}

TEST(KvBudget, ApportionSumsExactlyAndBreaksTiesByIndex) {
  EXPECT_EQ(apportion(10, {1, 1, 1}), (std::vector<int>{4, 3, 3}));
  EXPECT_EQ(apportion(7, {0, 0}), (std::vector<int>{4, 3}));
  EXPECT_EQ(sum(apportion(3'000'000'000LL / 2, {1, 2, 3})), 1'500'000'000);
}

}  // namespace
}  // namespace ekva
