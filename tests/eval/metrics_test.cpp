// Evaluation statistics on hand-made cases: Wilson intervals against published values,
// perplexity of a known distribution, iso-quality budgets.
#include "eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "engine/loss.h"
#include "eval/report.h"

namespace ekva {
namespace {

TEST(WilsonInterval, MatchesPublishedValues) {
  // Newcombe (1998), Statistics in Medicine 17:857, table I, method 3: 95% intervals.
  const Interval zero = wilson_interval(0, 20);
  EXPECT_DOUBLE_EQ(zero.low, 0.0);
  EXPECT_NEAR(zero.high, 0.1611, 5e-5);
  const Interval one = wilson_interval(1, 29);
  EXPECT_NEAR(one.low, 0.0061, 5e-5);
  EXPECT_NEAR(one.high, 0.1718, 5e-5);
  const Interval most = wilson_interval(81, 263);
  EXPECT_NEAR(most.low, 0.2553, 5e-5);
  EXPECT_NEAR(most.high, 0.3662, 5e-5);
  const Interval all = wilson_interval(29, 29);
  EXPECT_NEAR(all.low, 0.8830, 5e-5);
  EXPECT_DOUBLE_EQ(all.high, 1.0);
}

TEST(WilsonInterval, RefusesImpossibleCounts) {
  EXPECT_THROW(wilson_interval(1, 0), Error);
  EXPECT_THROW(wilson_interval(4, 3), Error);
  EXPECT_THROW(wilson_interval(-1, 3), Error);
}

TEST(Perplexity, OfAUniformDistributionIsItsSize) {
  // A model that spreads its mass evenly over 50 tokens: every next token costs ln 50.
  const int vocab = 50;
  const std::vector<float> logits(3 * vocab, 0.25f);
  const double nll = next_token_loss(logits, {7, 3, 49, 0}, vocab);
  EXPECT_NEAR(nll, std::log(50.0), 1e-6);
  const PerplexityEstimate e = perplexity_of({3 * nll, 5 * nll}, {3, 5});
  EXPECT_NEAR(e.perplexity, 50.0, 1e-6);
  EXPECT_NEAR(e.interval.low, 50.0, 1e-6);  // every window agrees: no spread
  EXPECT_NEAR(e.interval.high, 50.0, 1e-6);
}

TEST(Perplexity, IntervalFollowsTheSpreadOfWindows) {
  // Window means ln 10 and ln 40 (equal tokens): ppl exp(mean) = 20; half-width 1.96 x s / sqrt(2).
  const double a = std::log(10.0), b = std::log(40.0);
  const PerplexityEstimate e = perplexity_of({4 * a, 4 * b}, {4, 4});
  EXPECT_NEAR(e.perplexity, 20.0, 1e-9);
  const double half = 1.96 * std::abs(a - b) / std::sqrt(2.0) / std::sqrt(2.0);
  EXPECT_NEAR(e.interval.low, 20.0 * std::exp(-half), 1e-9);
  EXPECT_NEAR(e.interval.high, 20.0 * std::exp(half), 1e-9);
  EXPECT_THROW(perplexity_of({}, {}), Error);
  EXPECT_THROW(perplexity_of({1.0}, {0}), Error);
}

TEST(IsoQuality, SmallestBudgetOfTheUnbrokenRunFromTheTop) {
  // Given out of order; 0.2 reaches the reference but 0.5 drops below 99% again.
  const std::vector<QualityPoint> points = {
      {1.0, 1.0, 400, 1.0}, {0.1, 0.5, 40, 0.1}, {0.5, 0.9, 200, 0.5}, {0.2, 1.0, 80, 0.2}};
  EXPECT_EQ(smallest_budget_keeping(points, 1.0, 0.99), std::optional<size_t>(0));
  EXPECT_EQ(smallest_budget_keeping(points, 1.0, 0.85), std::optional<size_t>(3));
  EXPECT_EQ(smallest_budget_keeping(points, 1.0, 0.5), std::optional<size_t>(1));
  EXPECT_EQ(smallest_budget_keeping(points, 2.0, 0.99), std::nullopt);
}

TaskScore score(const std::string& task, const std::string& policy, double budget, double quality,
                double kv_fraction) {
  TaskScore s{task, policy, budget, quality, {quality, quality}, quality, 10, 0, 0, kv_fraction};
  s.kv_bytes = 1000 * kv_fraction;
  s.kv_bytes_full = 1000;
  return s;
}

TEST(IsoQuality, RowsPerTaskPolicyAndShareAgainstTheFullCache) {
  const std::vector<TaskScore> scores = {
      score("passkey", "full", 1.0, 0.8, 1.0),     score("passkey", "snapkv", 0.1, 0.4, 0.12),
      score("passkey", "snapkv", 0.3, 0.78, 0.31), score("passkey", "snapkv", 0.5, 0.8, 0.5),
      score("passkey", "ekva", 0.1, 0.8, 0.11),    score("passkey", "ekva", 0.3, 0.8, 0.3),
      score("ppl", "full", 1.0, 1.0 / 20, 1.0),    score("ppl", "ekva", 0.1, 1.0 / 30, 0.1),
      score("ppl", "ekva", 0.3, 1.0 / 20.1, 0.3)};
  const std::vector<IsoQualityRow> rows = iso_quality(scores, {0.99, 0.95});
  ASSERT_EQ(rows.size(), 6u);  // passkey x {snapkv, ekva} x 2 shares; ppl x ekva x 2
  EXPECT_EQ(rows[0].policy, "snapkv");
  ASSERT_TRUE(rows[0].at);
  EXPECT_DOUBLE_EQ(rows[0].at->budget, 0.5);  // 0.78 < 0.99 x 0.8
  ASSERT_TRUE(rows[1].at);
  EXPECT_DOUBLE_EQ(rows[1].at->budget, 0.3);  // 0.78 >= 0.95 x 0.8
  EXPECT_DOUBLE_EQ(rows[2].at->budget, 0.1);
  EXPECT_DOUBLE_EQ(rows[2].at->kv_fraction, 0.11);
  EXPECT_EQ(rows[4].task, "ppl");
  EXPECT_DOUBLE_EQ(rows[4].at->budget, 0.3);  // ppl 20.1 keeps 99.5% of 1/20
  EXPECT_THROW(iso_quality({score("passkey", "ekva", 0.1, 1, 0.1)}, {0.99}), Error);
}

TEST(Report, CsvHasAHeaderAndOneRowPerScore) {
  const std::vector<TaskScore> scores = {score("passkey", "full", 1.0, 1.0, 1.0),
                                         score("passkey", "ekva", 0.2, 0.5, 0.21)};
  const std::string csv = results_csv(scores);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_EQ(csv.rfind("task,policy,budget,score,", 0), 0u);
  EXPECT_NE(csv.find("passkey,ekva,0.2,0.5,"), std::string::npos);
  const std::string svg = score_chart_svg("passkey", scores);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("ekva"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_THROW(score_chart_svg("ppl", scores), Error);
}

}  // namespace
}  // namespace ekva
