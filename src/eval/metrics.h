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
