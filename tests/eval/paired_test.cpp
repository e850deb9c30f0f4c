// Paired comparisons of policies on the same samples: the exact binomial p-value against splits
// counted by hand, McNemar on answers, the sign test on per-window losses, and the report's rows
// against the best expert-blind policy.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "eval/metrics.h"
#include "eval/report.h"

namespace ekva {
namespace {

// Under the null hypothesis each of n discordant samples goes either way with probability 1/2.
TEST(ExactBinomial, AllDiscordantSamplesOneWay) {
  // b = 0, c = n: the only splits as extreme are all one way or all the other, 2 x 0.5^n.
  for (int n : {2, 5, 10, 20, 60}) {
    EXPECT_DOUBLE_EQ(exact_binomial_p(0, n), 2 * std::pow(0.5, n)) << n;
    EXPECT_DOUBLE_EQ(exact_binomial_p(n, 0), exact_binomial_p(0, n));
  }
  EXPECT_DOUBLE_EQ(exact_binomial_p(0, 1), 1.0);  // one sample says nothing: 2 x 0.5
  // Far past where 0.5^n underflows a double the p-value is still a number, and tiny.
  EXPECT_GE(exact_binomial_p(0, 2000), 0.0);
  EXPECT_LT(exact_binomial_p(0, 2000), 1e-300);
  EXPECT_LT(exact_binomial_p(400, 1600), 1e-100);
}

TEST(ExactBinomial, SmallSplitsCountedByHand) {
  // n = 6, min 1: 2 x (C(6,0) + C(6,1)) / 2^6 = 2 x 7 / 64.
  EXPECT_DOUBLE_EQ(exact_binomial_p(1, 5), 14.0 / 64);
  EXPECT_DOUBLE_EQ(exact_binomial_p(5, 1), 14.0 / 64);
  // n = 10, min 2: 2 x (1 + 10 + 45) / 1024.
  EXPECT_DOUBLE_EQ(exact_binomial_p(2, 8), 112.0 / 1024);
  // n = 12: 1 against 11 gives 2 x 13 / 4096 = 0.0063, 2 against 10 gives 2 x 79 / 4096 = 0.039,
  // so the usual 0.01 line falls between them.
  EXPECT_DOUBLE_EQ(exact_binomial_p(1, 11), 26.0 / 4096);
  EXPECT_DOUBLE_EQ(exact_binomial_p(2, 10), 2 * 79.0 / 4096);
  // Even or near-even splits: the doubled tail reaches 1 and is capped.
  EXPECT_DOUBLE_EQ(exact_binomial_p(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(exact_binomial_p(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(exact_binomial_p(3, 4), 1.0);  // 2 x (1 + 7 + 21 + 35) / 128 = 1
  EXPECT_DOUBLE_EQ(exact_binomial_p(500, 500), 1.0);
  EXPECT_THROW(exact_binomial_p(-1, 3), Error);
}

TEST(ExactBinomial, LargeCountsAgreeWithRationalArithmetic) {
  // Past 2^53 the coefficients are summed in logs. Expected values: the same sum in exact
  // rational arithmetic (Python's fractions and math.comb), rounded to a double.
  EXPECT_NEAR(exact_binomial_p(20, 40), 0.01348929373119186, 1e-13);   // exact path
  EXPECT_NEAR(exact_binomial_p(40, 60), 0.056887933640980791, 1e-13);  // logs
  EXPECT_NEAR(exact_binomial_p(420, 300), 8.8077561686150781e-06, 1e-16);
}

TEST(PairedTest, McNemarCountsTheDiscordantSamples) {
  // Samples 0 and 4 only the first answers, 2 and 6 only the second, 5 both, 1 and 3 neither.
  const std::vector<double> first = {1, 0, 0, 0, 1, 1, 0}, second = {0, 0, 1, 0, 0, 1, 1};
  const PairedTest t = paired_exact_test(first, second, true);
  EXPECT_EQ(t.first_better, 2);
  EXPECT_EQ(t.second_better, 2);
  EXPECT_DOUBLE_EQ(t.p_value, 1.0);
  // Twelve samples the first alone answers, none the other way: 2 x 0.5^12.
  const PairedTest one_sided =
      paired_exact_test(std::vector<double>(12, 1.0), std::vector<double>(12, 0.0), true);
  EXPECT_EQ(one_sided.first_better, 12);
  EXPECT_EQ(one_sided.second_better, 0);
  EXPECT_NEAR(one_sided.p_value, 2.0 / 4096, 1e-15);
  EXPECT_THROW(paired_exact_test({1, 0}, {1}, true), Error);
  EXPECT_THROW(paired_exact_test({}, {}, true), Error);
}

TEST(PairedTest, SignTestOnLossesWhereLowerIsBetter) {
  // Per-window NLL per token: the first is lower on windows 0, 1, 3; higher on 2; equal on 4.
  const PairedTest t =
      paired_exact_test({2.0, 3.1, 2.5, 1.0, 4.0}, {2.2, 3.3, 2.4, 1.5, 4.0}, false);
  EXPECT_EQ(t.first_better, 3);
  EXPECT_EQ(t.second_better, 1);
  EXPECT_NEAR(t.p_value, 2 * 5.0 / 16, 1e-15);  // n = 4, min 1: 2 x (1 + 4) / 16
}

// A score with per-sample outcomes: 0/1 answers, or (tokens given) per-window NLL sums.
TaskScore with_samples(const std::string& task, const std::string& policy, double budget,
                       const std::vector<double>& values, const std::vector<int>& tokens = {}) {
  TaskScore s{task, policy, budget, 0, {}, 0, static_cast<int>(values.size()), 0, 0, 0};
  s.sample_values = values;
  s.sample_tokens = tokens;
  const double sum = std::accumulate(values.begin(), values.end(), 0.0);
  if (tokens.empty()) {
    s.score = s.quality = sum / static_cast<double>(values.size());
  } else {
    s.score = std::exp(sum / std::accumulate(tokens.begin(), tokens.end(), 0));
    s.quality = 1.0 / s.score;
  }
  return s;
}

TEST(PairedReport, EveryPolicyAgainstTheBestExpertBlindOne) {
  const std::vector<TaskScore> scores = {
      with_samples("passkey", "full", 1.0, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}),
      with_samples("passkey", "snapkv", 0.1, {1, 1, 0, 0, 0, 0, 0, 0, 0, 0}),
      with_samples("passkey", "adakv", 0.1, {1, 1, 1, 1, 0, 0, 0, 0, 0, 0}),
      with_samples("passkey", "ekva", 0.1, {1, 1, 1, 1, 1, 1, 1, 1, 1, 0}),
      with_samples("passkey", "ekva-nogroup", 0.1, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}),
      // No expert-blind policy at 0.2: nothing to compare with.
      with_samples("passkey", "ekva", 0.2, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1})};
  const std::vector<PairedRow> rows = paired_comparisons(scores);
  ASSERT_EQ(rows.size(), 3u);
  for (const PairedRow& r : rows) {
    EXPECT_EQ(r.baseline, "adakv");  // 0.4, the best of snapkv and adakv
    EXPECT_DOUBLE_EQ(r.baseline_score, 0.4);
    EXPECT_DOUBLE_EQ(r.budget, 0.1);
  }
  // snapkv: adakv alone answers samples 2 and 3, so 0 against 2: 2 x 0.5^2.
  EXPECT_EQ(rows[0].policy, "snapkv");
  EXPECT_EQ(rows[0].test.first_better, 0);
  EXPECT_EQ(rows[0].test.second_better, 2);
  EXPECT_DOUBLE_EQ(rows[0].test.p_value, 0.5);
  // ekva alone answers samples 4 to 8: 5 against 0, 2 x 0.5^5.
  EXPECT_EQ(rows[1].policy, "ekva");
  EXPECT_EQ(rows[1].test.first_better, 5);
  EXPECT_EQ(rows[1].test.second_better, 0);
  EXPECT_DOUBLE_EQ(rows[1].test.p_value, 2.0 / 32);
  EXPECT_DOUBLE_EQ(rows[1].score, 0.9);
  // ekva-nogroup answers nothing: 0 against 4, 2 x 0.5^4.
  EXPECT_EQ(rows[2].policy, "ekva-nogroup");
  EXPECT_DOUBLE_EQ(rows[2].test.p_value, 2.0 / 16);

  const std::string md = paired_markdown(rows);
  EXPECT_EQ(std::count(md.begin(), md.end(), '\n'), 5);  // header, rule, three rows
  EXPECT_NE(md.find("| passkey | 0.1 | ekva | 0.9 | adakv | 0.4 | 5 | 0 | 0.0625 |"),
            std::string::npos)
      << md;
  const std::string csv = paired_csv(rows);
  EXPECT_EQ(csv.rfind("task,budget,policy,baseline,", 0), 0u);
  EXPECT_NE(csv.find("passkey,0.1,ekva,adakv,0.9,0.4,5,0,0.0625\n"), std::string::npos) << csv;
  const nlohmann::json j = paired_json(rows);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[1]["policy_better"], 5);
  EXPECT_EQ(j[1]["baseline_better"], 0);
  EXPECT_DOUBLE_EQ(j[1]["p_value"].get<double>(), 2.0 / 32);
}

TEST(PairedReport, ATieForBestGoesToTheFirstListed) {
  const std::vector<TaskScore> scores = {with_samples("passkey", "snapkv", 0.1, {1, 0, 1, 0}),
                                         with_samples("passkey", "adakv", 0.1, {0, 1, 0, 1}),
                                         with_samples("passkey", "ekva", 0.1, {1, 1, 1, 1})};
  const std::vector<PairedRow> rows = paired_comparisons(scores);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].policy, "adakv");
  EXPECT_EQ(rows[0].baseline, "snapkv");
  EXPECT_EQ(rows[0].test.first_better, 2);
  EXPECT_EQ(rows[0].test.second_better, 2);
  EXPECT_EQ(rows[1].baseline, "snapkv");
}

TEST(PairedReport, PerplexityPairsWindowsByLossPerToken) {
  // Ten tokens per window. adakv (NLL per token 2, 3, 4) beats streaming (2.5, 3.5, 4.5), so it is
  // the baseline; ekva (1.8, 3.3, 3.5) is lower on windows 0 and 2, higher on 1.
  const std::vector<int> tokens = {10, 10, 10};
  const std::vector<TaskScore> scores = {
      with_samples("ppl", "streaming", 0.1, {25, 35, 45}, tokens),
      with_samples("ppl", "adakv", 0.1, {20, 30, 40}, tokens),
      with_samples("ppl", "ekva", 0.1, {18, 33, 35}, tokens)};
  const std::vector<PairedRow> rows = paired_comparisons(scores);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].policy, "streaming");
  EXPECT_EQ(rows[0].baseline, "adakv");
  EXPECT_EQ(rows[0].test.first_better, 0);
  EXPECT_EQ(rows[0].test.second_better, 3);
  EXPECT_DOUBLE_EQ(rows[0].test.p_value, 2.0 / 8);
  EXPECT_EQ(rows[1].test.first_better, 2);
  EXPECT_EQ(rows[1].test.second_better, 1);
  EXPECT_DOUBLE_EQ(rows[1].test.p_value, 1.0);  // 2 x (1 + 3) / 8, capped
  EXPECT_NEAR(rows[1].baseline_score, std::exp(3.0), 1e-12);
}

TEST(PairedReport, PoliciesMustShareTheirSamples) {
  EXPECT_THROW(paired_comparisons({with_samples("passkey", "adakv", 0.1, {1, 0, 1}),
                                   with_samples("passkey", "ekva", 0.1, {1, 0})}),
               Error);
  EXPECT_THROW(paired_comparisons({with_samples("passkey", "adakv", 0.1, {})}), Error);
}

TEST(PairedReport, ScoresCarryTheirSamplesInJson) {
  const nlohmann::json answers = score_json(with_samples("passkey", "ekva", 0.1, {1, 0, 1}));
  EXPECT_EQ(answers["correct"], nlohmann::json({1, 0, 1}));
  EXPECT_FALSE(answers.contains("nll"));
  const nlohmann::json ppl = score_json(with_samples("ppl", "ekva", 0.1, {20.5, 31}, {10, 12}));
  EXPECT_EQ(ppl["nll"], nlohmann::json({20.5, 31.0}));
  EXPECT_EQ(ppl["tokens"], nlohmann::json({10, 12}));
  EXPECT_FALSE(ppl.contains("correct"));
}

TEST(PairedReport, TheExpertBlindListNamesNoExpertAwarePolicy) {
  for (const std::string& name : expert_blind_policies()) {
    EXPECT_EQ(name.find("ekva"), std::string::npos) << name;
    EXPECT_NE(name, "full");
  }
}

}  // namespace
}  // namespace ekva
