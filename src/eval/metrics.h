#pragma once
// Statistics of an evaluation: confidence intervals of accuracies and perplexities, and the
// iso-quality question (the least KV a policy needs to keep a share of full-KV quality).
#include <cstddef>
#include <optional>
#include <vector>

namespace ekva {

struct Interval {
  double low = 0.0;
  double high = 0.0;
};

// Wilson score interval of a binomial proportion (successes of n trials) at normal quantile z;
// unlike the normal approximation it stays inside [0, 1] and is informative at 0 or n successes.
Interval wilson_interval(int successes, int n, double z = 1.96);

// Perplexity of scored windows, exp(total NLL / total tokens), and an interval from the spread of
// the windows' mean NLLs (normal approximation on the mean; the point itself for one window).
struct PerplexityEstimate {
  double perplexity = 0.0;
  Interval interval;
};
PerplexityEstimate perplexity_of(const std::vector<double>& nll_sums,
                                 const std::vector<int>& tokens, double z = 1.96);

// A paired comparison of two policies on the same samples. Samples where both do equally well
// carry no information about which is better and are dropped; of the n discordant ones, under the
// null hypothesis that neither policy is better, the first wins each with probability 1/2.
struct PairedTest {
  int first_better = 0;   // discordant samples the first policy won
  int second_better = 0;  // discordant samples the second policy won
  double p_value = 1.0;   // two-sided, exact
};

// The exact two-sided binomial p-value of a split of discordant pairs:
// min(1, 2 P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2); 1 when there are none. No normal
// approximation, so it is right for the handful of discordant samples a small evaluation has.
double exact_binomial_p(int first_better, int second_better);

// Compares per-sample values of two policies. With 0/1 outcomes (answered or not, higher is
// better) this is McNemar's exact test; with per-window NLL per token (lower is better) it is the
// exact sign test. Throws kInvalidArgument when the vectors differ in length or are empty.
PairedTest paired_exact_test(const std::vector<double>& first, const std::vector<double>& second,
                             bool higher_is_better);

// One evaluated budget of one policy on one task. quality is higher-is-better (accuracy, or
// 1 / perplexity), so "keeps 99% of full-KV quality" means quality >= 0.99 x the full cache's.
struct QualityPoint {
  double budget = 0.0;
  double quality = 0.0;
  double kv_bytes = 0.0;
  double kv_fraction = 0.0;
};

// The index (into points) of the smallest budget from which on every larger budget keeps
// quality >= share x reference; nullopt when even the largest does not. Points may come in any
// order; budgets compare as given (all fractions or all tokens).
std::optional<size_t> smallest_budget_keeping(const std::vector<QualityPoint>& points,
                                              double reference, double share);

}  // namespace ekva
