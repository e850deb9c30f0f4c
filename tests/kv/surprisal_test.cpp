// Routing surprisal on inputs small enough to count by hand: every expected value below is the
// definition in surprisal.h worked out for the input next to it.
#include "kv/surprisal.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace ekva {
namespace {

LayerRouting routing(int top_k, std::vector<int32_t> experts, std::vector<float> gates = {}) {
  return {top_k, std::move(experts), std::move(gates)};
}

TEST(Surprisal, DefinitionFollowsTopK) {
  EXPECT_EQ(surprisal_definition(1), SurprisalDefinition::kExactSet);
  EXPECT_EQ(surprisal_definition(3), SurprisalDefinition::kExactSet);
  EXPECT_EQ(surprisal_definition(4), SurprisalDefinition::kGateWeightedLoad);
  EXPECT_EQ(surprisal_definition(8), SurprisalDefinition::kGateWeightedLoad);
}

TEST(Surprisal, ExactSetsAreCountedInThePromptAndSummedOverLayers) {
  // Layer 0 (top-2): {1,3} {3,1} {0,2} {1,3}: the set {1,3} three times in four (order and gates do
  // not matter), {0,2} once. Layer 1 (top-1): 5 5 5 6.
  const std::vector<LayerRouting> layers = {
      routing(2, {1, 3, 3, 1, 0, 2, 1, 3}, {0.9f, 0.1f, 0.5f, 0.5f, 0.6f, 0.4f, 0.7f, 0.3f}),
      routing(1, {5, 5, 5, 6})};
  const std::vector<double> s = routing_surprisal(layers, 4);
  ASSERT_EQ(s.size(), 4u);
  const double common = -std::log(3.0 / 4.0), rare = -std::log(1.0 / 4.0);
  EXPECT_NEAR(s[0], common + common, 1e-12);
  EXPECT_NEAR(s[1], common + common, 1e-12);
  EXPECT_NEAR(s[2], rare + common, 1e-12);
  EXPECT_NEAR(s[3], common + rare, 1e-12);
}

TEST(Surprisal, GateWeightedLoadsFromTopKFour) {
  // Six experts, top-4. Token 1's gates are token 0's doubled, so after renormalisation over the
  // top-k they weigh the same. In-context loads (renormalised gates summed, over 3 tokens):
  // e0 (.4+.4+.25)/3, e1 (.3+.3+.25)/3, e2 .4/3, e3 .2/3, e4 .25/3, e5 .25/3 (they sum to 1).
  const std::vector<LayerRouting> layers = {
      routing(4, {0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1},
              {0.4f, 0.3f, 0.2f, 0.1f, 0.8f, 0.6f, 0.4f, 0.2f, 0.25f, 0.25f, 0.25f, 0.25f})};
  const std::vector<double> s = routing_surprisal(layers, 3);
  const double l0 = 1.05 / 3, l1 = 0.85 / 3, l2 = 0.4 / 3, l3 = 0.2 / 3, l45 = 0.25 / 3;
  const double first =
      -(0.4 * std::log(l0) + 0.3 * std::log(l1) + 0.2 * std::log(l2) + 0.1 * std::log(l3));
  EXPECT_NEAR(s[0], first, 1e-6);  // gates are floats
  EXPECT_DOUBLE_EQ(s[1], s[0]);
  EXPECT_NEAR(s[2], -0.25 * (2 * std::log(l45) + std::log(l0) + std::log(l1)), 1e-6);
  // The two tokens on lightly loaded experts 4 and 5 make token 2 the most surprising.
  EXPECT_GT(s[2], s[0]);
}

TEST(Surprisal, SetsThatNeverRepeatStillRankByLoadFromTopKFour) {
  // Four tokens, each a different set of four of six experts: as exact sets every token would score
  // ln 4. Expert counts: e0 4, e1 4, e2 3, e3 2, e4 2, e5 1; even gates make load_e = count / 16.
  const std::vector<LayerRouting> layers = {
      routing(4, {0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 3, 4, 0, 1, 2, 5}, std::vector<float>(16, 0.25f))};
  const std::vector<double> s = routing_surprisal(layers, 4);
  const auto c = [](double count) { return -std::log(count / 16); };
  EXPECT_NEAR(s[0], 0.25 * (2 * c(4) + c(3) + c(2)), 1e-12);
  EXPECT_NEAR(s[1], 0.25 * (2 * c(4) + c(3) + c(2)), 1e-12);
  EXPECT_NEAR(s[2], 0.25 * (2 * c(4) + 2 * c(2)), 1e-12);
  EXPECT_NEAR(s[3], 0.25 * (2 * c(4) + c(3) + c(1)), 1e-12);
  EXPECT_GT(s[3], s[2]);
  EXPECT_GT(s[2], s[0]);
}

TEST(Surprisal, NoMoeLayersMeansNoSurprisal) {
  // Dense layers are not passed; a model (or a prompt's slice) without MoE layers scores zero.
  EXPECT_EQ(routing_surprisal({}, 5), std::vector<double>(5, 0.0));
  EXPECT_TRUE(routing_surprisal({routing(2, {})}, 0).empty());
}

TEST(Surprisal, AllTokensRoutedAlikeReserveNothing) {
  std::vector<int32_t> experts;
  for (int t = 0; t < 20; ++t) experts.insert(experts.end(), {0, 1});
  const std::vector<double> s = routing_surprisal({routing(2, experts)}, 20);
  EXPECT_EQ(s, std::vector<double>(20, 0.0));  // -ln 1
  // Even a threshold below zero finds no outlier among equal scores.
  EXPECT_TRUE(surprisal_outliers(s, -1.0).empty());
  EXPECT_TRUE(reserved_tokens(s, 100).empty());
  EXPECT_TRUE(surprisal_outliers(std::vector<double>(7, 2.5), 0.0).empty());
}

TEST(Surprisal, TokenIdRarity) {
  const std::vector<double> s = token_rarity_surprisal({7, 7, 9, 7});
  EXPECT_NEAR(s[0], -std::log(3.0 / 4.0), 1e-12);
  EXPECT_NEAR(s[2], -std::log(1.0 / 4.0), 1e-12);
  EXPECT_DOUBLE_EQ(s[1], s[3]);
  EXPECT_TRUE(token_rarity_surprisal({}).empty());
}

// One spike of height h among n - 1 zeros: mean h / n, sd h sqrt(n - 1) / n, so the spike lies
// above mean + z sd exactly when sqrt(n - 1) > z. For z = 3: not with n = 9, but with n = 11.
TEST(SurprisalOutliers, ASingleSpikeNeedsEnoughTokensAroundIt) {
  std::vector<double> nine(9, 0.0), eleven(11, 0.0);
  nine[4] = 2.0;
  eleven[4] = 2.0;
  EXPECT_TRUE(surprisal_outliers(nine, 3.0).empty());
  EXPECT_EQ(surprisal_outliers(eleven, 3.0), std::vector<int>{4});
  EXPECT_EQ(surprisal_outliers(nine, 2.0), std::vector<int>{4});  // sqrt 8 > 2
  EXPECT_TRUE(surprisal_outliers({}, 3.0).empty());
}

// 60 tokens: 6 at position 12 and 4 at positions 30 and 5, zeros elsewhere. Mean 14 / 60, second
// moment 68 / 60, so sd = sqrt(68/60 - (14/60)^2) ~ 1.04 and the cut at z = 3 is ~ 3.35: all three
// are outliers, the highest first and the tied pair in position order.
std::vector<double> three_outliers() {
  std::vector<double> s(60, 0.0);
  s[12] = 6.0;
  s[30] = 4.0;
  s[5] = 4.0;
  return s;
}

TEST(SurprisalOutliers, HighestFirstTiesByEarlierPosition) {
  const double mean = 14.0 / 60, sd = std::sqrt(68.0 / 60 - mean * mean);
  ASSERT_LT(mean + 3 * sd, 4.0);
  ASSERT_GT(mean + 4 * sd, 4.0);
  EXPECT_EQ(surprisal_outliers(three_outliers(), 3.0), (std::vector<int>{12, 5, 30}));
  EXPECT_EQ(surprisal_outliers(three_outliers(), 4.0), std::vector<int>{12});
}

TEST(SurprisalReserve, CapRoundsDown) {
  EXPECT_EQ(reserve_limit(0.25, 8), 2u);
  EXPECT_EQ(reserve_limit(0.25, 10), 2u);    // 2.5
  EXPECT_EQ(reserve_limit(0.25, 3), 0u);     // 0.75
  EXPECT_EQ(reserve_limit(0.29, 100), 29u);  // 28.999999999999996 in doubles
  EXPECT_EQ(reserve_limit(1.0, 7), 7u);
  EXPECT_EQ(reserve_limit(0.0, 100), 0u);
  EXPECT_EQ(reserve_limit(0.5, 0), 0u);
  EXPECT_THROW(reserve_limit(-0.1, 10), Error);
  EXPECT_THROW(reserve_limit(1.5, 10), Error);
  EXPECT_THROW(reserve_limit(std::numeric_limits<double>::quiet_NaN(), 10), Error);
  EXPECT_THROW(reserve_limit(0.25, -1), Error);
}

// Per token (span 0) at z = 3 and cap 0.25, which the tests below spell out: the defaults are the
// dev seed's choice and may move.
const ReserveOptions kPerToken{3.0, 0.25, 0};

TEST(SurprisalReserve, TheCapKeepsTheMostSurprisingFirst) {
  const std::vector<double> s = three_outliers();
  EXPECT_EQ(reserved_tokens(s, 100, kPerToken), (std::vector<int>{12, 5, 30}));  // limit 25
  EXPECT_EQ(reserved_tokens(s, 8, kPerToken), (std::vector<int>{12, 5}));        // limit 2
  EXPECT_EQ(reserved_tokens(s, 4, kPerToken), std::vector<int>{12});             // limit 1
  EXPECT_TRUE(reserved_tokens(s, 3, kPerToken).empty());                         // limit 0
  EXPECT_EQ(reserved_tokens(s, 100, {4.0, 0.25, 0}), std::vector<int>{12});
  EXPECT_EQ(reserved_tokens(s, 4, {3.0, 0.5, 0}), (std::vector<int>{12, 5}));
  EXPECT_THROW(surprisal_outliers(s, std::numeric_limits<double>::infinity()), Error);
  EXPECT_THROW(surprisal_outliers({0.0, std::numeric_limits<double>::quiet_NaN()}, 3.0), Error);
}

// Span 1: each token's mean over itself and its two neighbours (one at either end of the prompt).
TEST(SurprisalReserve, SpanMeanAveragesOverTheNeighbours) {
  const std::vector<double> s = {0, 0, 9, 0, 0, 0, 3, 3, 3, 0};
  const std::vector<double> mean = span_mean(s, 1);
  const std::vector<double> expected = {0, 3, 3, 3, 0, 1, 2, 3, 2, 1.5};
  ASSERT_EQ(mean.size(), expected.size());
  for (size_t t = 0; t < expected.size(); ++t) EXPECT_DOUBLE_EQ(mean[t], expected[t]) << t;
  EXPECT_EQ(span_mean(s, 0), s);
  for (double m : span_mean(s, 10)) EXPECT_DOUBLE_EQ(m, 1.8);  // every window is the prompt
  EXPECT_TRUE(span_mean({}, 2).empty());
  EXPECT_THROW(span_mean(s, -1), Error);
}

// 60 tokens: a lone spike of 6 at position 12 and a run of five 4s at 40-44, zeros elsewhere. Per
// token: mean 26/60, sd ~ 1.32, cut at z = 3 ~ 4.40, so the spike alone is an outlier. Span 1: the
// spike spreads to 2, 2, 2 and the run to 4/3, 8/3, 4, 4, 4, 8/3, 4/3; mean 26/60, sd ~ 1.05, cut
// ~ 3.59, so the run's middle three are the outliers and the spike is not.
TEST(SurprisalReserve, ASpanKeepsARunAndDropsALoneSpike) {
  std::vector<double> s(60, 0.0);
  s[12] = 6.0;
  for (int t = 40; t < 45; ++t) s[t] = 4.0;
  EXPECT_EQ(reserved_tokens(s, 100, kPerToken), std::vector<int>{12});
  EXPECT_EQ(reserved_tokens(s, 100, {3.0, 0.25, 1}), (std::vector<int>{41, 42, 43}));
}

TEST(SurprisalReserve, ANeedleRoutedUnlikeItsFillerIsReserved) {
  // 50 tokens at top-2: filler alternates between {0,1} (25 tokens) and {2,3} (24), one needle
  // token at position 31 goes to {1,2}. Surprisals ln 2, ln(50/24), ln 50 ~ 3.9; the cut is ~ 2.1.
  std::vector<int32_t> experts;
  for (int t = 0; t < 50; ++t) {
    if (t == 31) {
      experts.insert(experts.end(), {2, 1});
    } else if (t % 2 == 0) {
      experts.insert(experts.end(), {0, 1});
    } else {
      experts.insert(experts.end(), {3, 2});
    }
  }
  const std::vector<double> s = routing_surprisal({routing(2, experts)}, 50);
  EXPECT_NEAR(s[31], std::log(50.0), 1e-12);
  EXPECT_NEAR(s[0], std::log(2.0), 1e-12);
  EXPECT_NEAR(s[1], std::log(50.0 / 24), 1e-12);
  EXPECT_EQ(reserved_tokens(s, 10, kPerToken), std::vector<int>{31});
  // Deterministic: the same routing gives the same numbers.
  EXPECT_EQ(routing_surprisal({routing(2, experts)}, 50), s);
}

TEST(Surprisal, MalformedRoutingIsRefused) {
  EXPECT_THROW(routing_surprisal({routing(0, {})}, 0), Error);
  EXPECT_THROW(routing_surprisal({routing(2, {0, 1, 2})}, 2), Error);       // 3 entries for 2 x 2
  EXPECT_THROW(routing_surprisal({routing(2, {0, 1, 2, 2})}, 2), Error);    // expert twice
  EXPECT_THROW(routing_surprisal({routing(1, {0, -1})}, 2), Error);         // negative expert
  EXPECT_THROW(routing_surprisal({routing(1, {0, 1}, {1.0f})}, 2), Error);  // gates short
  // Loads need gates: none, a negative one, a NaN, a token whose gates sum to zero.
  EXPECT_THROW(routing_surprisal({routing(4, {0, 1, 2, 3})}, 1), Error);
  EXPECT_THROW(routing_surprisal({routing(4, {0, 1, 2, 3}, {0.5f, 0.5f, 0.1f, -0.1f})}, 1), Error);
  EXPECT_THROW(
      routing_surprisal(
          {routing(4, {0, 1, 2, 3}, {0.5f, std::numeric_limits<float>::quiet_NaN(), 0, 0})}, 1),
      Error);
  EXPECT_THROW(routing_surprisal({routing(4, {0, 1, 2, 3}, {0, 0, 0, 0})}, 1), Error);
  try {
    routing_surprisal({routing(2, {0, 1}), routing(2, {4, 4})}, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layer 1 token 0 has expert 4"), std::string::npos);
  }
}

}  // namespace
}  // namespace ekva
