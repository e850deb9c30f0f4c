#include "kv/kv_budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {

std::vector<int> apportion(int64_t total, const std::vector<double>& weights) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> out(weights.size(), 0);
  if (weights.empty() || total <= 0) return out;
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = sum > 0 ? static_cast<double>(total) * weights[i] / sum
                                 : static_cast<double>(total) / static_cast<double>(weights.size());
    out[i] = static_cast<int>(std::floor(exact));
    given += out[i];
    remainders.emplace_back(exact - out[i], i);
  }
  std::sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (int64_t i = 0; i < total - given; ++i)
    ++out[remainders[static_cast<size_t>(i) % remainders.size()].second];
  return out;
}

int mean_head_budget(const ModelSpec& spec, double budget, int64_t prompt_len) {
  if (!(budget > 0.0) || !std::isfinite(budget)) {
    fail(ErrorKind::kInvalidArgument,
         "KV budget {} must be a fraction in (0, 1] or a token count > 1", budget);
  }
  const double tokens = budget <= 1.0 ? budget * static_cast<double>(prompt_len) : budget;
  const double context = std::max(1, spec.max_position);
  return static_cast<int>(std::clamp(std::round(tokens), 1.0, context));
}

KvBudgets resolve_budgets(const ModelSpec& spec, const BudgetPlan* plan,
                          std::optional<double> budget, int64_t prompt_len) {
  const int L = spec.num_layers, H = spec.num_kv_heads;
  KvBudgets b;
  if (plan == nullptr) {
    b.head.assign(static_cast<size_t>(L) * H,
                  mean_head_budget(spec, budget.value_or(1.0), prompt_len));
    return b;
  }
  plan->check_model(spec);
  std::vector<double> w(static_cast<size_t>(L) * H);
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h)
      w[static_cast<size_t>(l) * H + h] = plan->retained_tokens(l, h, prompt_len);
  }
  const double plan_total = std::accumulate(w.begin(), w.end(), 0.0);
  const double context = std::max(1, spec.max_position);
  const int64_t total =
      budget ? static_cast<int64_t>(mean_head_budget(spec, *budget, prompt_len)) * L * H
             : static_cast<int64_t>(std::clamp(std::round(plan_total), 1.0, context * L * H));
  b.head = apportion(total, w);
  for (int& x : b.head) x = std::clamp(x, 1, static_cast<int>(context));
  b.sinks = plan->sink_tokens;
  b.recent = plan->recent_tokens;
  return b;
}

}  // namespace ekva
