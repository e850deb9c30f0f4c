#include "eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {

Interval wilson_interval(int successes, int n, double z) {
  if (n <= 0 || successes < 0 || successes > n) {
    fail(ErrorKind::kInvalidArgument, "Wilson interval: {} successes of {} trials", successes, n);
  }
  const double p = static_cast<double>(successes) / n;
  const double z2 = z * z;
  const double centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
  const double half = z * std::sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / (1.0 + z2 / n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

PerplexityEstimate perplexity_of(const std::vector<double>& nll_sums,
                                 const std::vector<int>& tokens, double z) {
  if (nll_sums.empty() || nll_sums.size() != tokens.size()) {
    fail(ErrorKind::kInvalidArgument, "perplexity: {} NLL sums for {} token counts",
         nll_sums.size(), tokens.size());
  }
  const double total_nll = std::accumulate(nll_sums.begin(), nll_sums.end(), 0.0);
  const long total_tokens = std::accumulate(tokens.begin(), tokens.end(), 0L);
  if (total_tokens <= 0) fail(ErrorKind::kInvalidArgument, "perplexity: no scored tokens");
  const double mean = total_nll / total_tokens;
  PerplexityEstimate e;
  e.perplexity = std::exp(mean);
  const size_t n = nll_sums.size();
  if (n < 2) {
    e.interval = {e.perplexity, e.perplexity};
    return e;
  }
  double var = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = nll_sums[i] / std::max(tokens[i], 1) - mean;
    var += d * d;
  }
  const double half = z * std::sqrt(var / (n - 1) / n);
  e.interval = {std::exp(mean - half), std::exp(mean + half)};
  return e;
}

double exact_binomial_p(int first_better, int second_better) {
  if (first_better < 0 || second_better < 0) {
    fail(ErrorKind::kInvalidArgument, "binomial test: {} and {} discordant samples", first_better,
         second_better);
  }
  const int n = first_better + second_better;
  const int m = std::min(first_better, second_better);
  if (2 * m == n) return 1.0;  // an even split, including none at all
  // sum_{i <= m} C(n, i) in integers held by doubles: C(n, i) = C(n, i - 1) (n - i + 1) / i divides
  // exactly, and scaling by 2^(1 - n) is exact, so small counts get the p-value to the last bit.
  constexpr double kExactBelow = 9007199254740992.0;  // 2^53
  double term = 1.0, tail = 1.0;
  bool exact = true;
  for (int i = 1; i <= m && exact; ++i) {
    const double product = term * (n - i + 1);
    exact = product < kExactBelow && tail + product / i < kExactBelow;
    if (exact) {
      term = product / i;
      tail += term;
    }
  }
  if (exact) return std::min(1.0, std::ldexp(tail, 1 - n));
  // Larger counts: P(X = i) for i <= m < n / 2 rises with i, so the tail is summed relative to
  // its largest term, P(X = m), itself computed in logs.
  const double log_top =
      std::lgamma(n + 1.0) - std::lgamma(m + 1.0) - std::lgamma(n - m + 1.0) - n * std::log(2.0);
  double ratio = 1.0;
  tail = 1.0;
  for (int i = m; i > 0; --i) {
    ratio *= static_cast<double>(i) / (n - i + 1);  // P(X = i - 1) / P(X = m)
    tail += ratio;
  }
  return std::min(1.0, 2.0 * std::exp(log_top) * tail);
}

PairedTest paired_exact_test(const std::vector<double>& first, const std::vector<double>& second,
                             bool higher_is_better) {
  if (first.empty() || first.size() != second.size()) {
    fail(ErrorKind::kInvalidArgument, "paired test: {} samples against {}", first.size(),
         second.size());
  }
  PairedTest t;
  for (size_t i = 0; i < first.size(); ++i) {
    if (first[i] == second[i]) continue;
    if ((first[i] > second[i]) == higher_is_better) {
      ++t.first_better;
    } else {
      ++t.second_better;
    }
  }
  t.p_value = exact_binomial_p(t.first_better, t.second_better);
  return t;
}

std::optional<size_t> smallest_budget_keeping(const std::vector<QualityPoint>& points,
                                              double reference, double share) {
  std::vector<size_t> order(points.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return points[a].budget < points[b].budget; });
  std::optional<size_t> best;
  // From the largest budget down: the answer is the last budget of the unbroken run that keeps it.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (points[*it].quality < share * reference) break;
    best = *it;
  }
  return best;
}

}  // namespace ekva
