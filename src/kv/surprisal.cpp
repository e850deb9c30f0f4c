#include "kv/surprisal.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/error.h"

namespace ekva {
namespace {

// Adds -ln(count of the token's type / T) to each token's surprisal.
template <typename Type>
void add_type_surprisal(const std::vector<Type>& types, std::vector<double>& surprisal) {
  std::map<Type, size_t> counts;
  for (const Type& type : types) ++counts[type];
  const double total = static_cast<double>(types.size());
  for (size_t t = 0; t < types.size(); ++t) {
    surprisal[t] -= std::log(static_cast<double>(counts.at(types[t])) / total);
  }
}

void check_layer(const LayerRouting& layer, size_t index, size_t tokens) {
  if (layer.top_k < 1) {
    fail(ErrorKind::kInvalidArgument, "routing surprisal: layer {} has top-k {}", index,
         layer.top_k);
  }
  const size_t k = static_cast<size_t>(layer.top_k);
  const bool needs_gates =
      surprisal_definition(layer.top_k) == SurprisalDefinition::kGateWeightedLoad;
  if (layer.experts.size() != tokens * k || (needs_gates && layer.gates.size() != tokens * k) ||
      (!layer.gates.empty() && layer.gates.size() != tokens * k)) {
    fail(ErrorKind::kInvalidArgument,
         "routing surprisal: layer {} holds {} experts and {} gates, not {} tokens x top-k {}",
         index, layer.experts.size(), layer.gates.size(), tokens, k);
  }
  for (size_t t = 0; t < tokens; ++t) {
    const int32_t* experts = &layer.experts[t * k];
    for (size_t i = 0; i < k; ++i) {
      if (experts[i] < 0 || std::find(experts, experts + i, experts[i]) != experts + i) {
        fail(ErrorKind::kInvalidArgument,
             "routing surprisal: layer {} token {} has expert {} {} in its top-k", index, t,
             experts[i], experts[i] < 0 ? "(negative)" : "twice");
      }
    }
  }
}

// Gates renormalised over each token's top-k, so that every token carries weight 1.
std::vector<double> renormalised_gates(const LayerRouting& layer, size_t index, size_t tokens) {
  const size_t k = static_cast<size_t>(layer.top_k);
  std::vector<double> g(layer.gates.begin(), layer.gates.end());
  for (size_t t = 0; t < tokens; ++t) {
    double sum = 0.0;
    for (size_t i = 0; i < k; ++i) {
      const double gate = g[t * k + i];
      if (!std::isfinite(gate) || gate < 0.0) {
        fail(ErrorKind::kInvalidArgument, "routing surprisal: layer {} token {} has gate {}", index,
             t, gate);
      }
      sum += gate;
    }
    if (sum <= 0.0) {
      fail(ErrorKind::kInvalidArgument, "routing surprisal: layer {} token {} has all gates zero",
           index, t);
    }
    for (size_t i = 0; i < k; ++i) g[t * k + i] /= sum;
  }
  return g;
}

void add_exact_set_surprisal(const LayerRouting& layer, size_t tokens,
                             std::vector<double>& surprisal) {
  const size_t k = static_cast<size_t>(layer.top_k);
  std::vector<std::vector<int32_t>> types(tokens);
  for (size_t t = 0; t < tokens; ++t) {
    types[t].assign(layer.experts.begin() + static_cast<ptrdiff_t>(t * k),
                    layer.experts.begin() + static_cast<ptrdiff_t>((t + 1) * k));
    std::sort(types[t].begin(), types[t].end());
  }
  add_type_surprisal(types, surprisal);
}

void add_load_surprisal(const LayerRouting& layer, size_t index, size_t tokens,
                        std::vector<double>& surprisal) {
  const size_t k = static_cast<size_t>(layer.top_k);
  const std::vector<double> g = renormalised_gates(layer, index, tokens);
  const int32_t max_expert = *std::max_element(layer.experts.begin(), layer.experts.end());
  std::vector<double> load(static_cast<size_t>(max_expert) + 1, 0.0);
  for (size_t i = 0; i < tokens * k; ++i) load[static_cast<size_t>(layer.experts[i])] += g[i];
  // Each token's renormalised gates sum to 1, so the total gate mass is the token count.
  for (double& l : load) l /= static_cast<double>(tokens);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t i = 0; i < k; ++i) {
      const size_t j = t * k + i;
      // A zero gate adds nothing, even where its expert's load is zero.
      if (g[j] > 0.0) surprisal[t] -= g[j] * std::log(load[static_cast<size_t>(layer.experts[j])]);
    }
  }
}

}  // namespace

SurprisalDefinition surprisal_definition(int top_k) {
  return top_k < 4 ? SurprisalDefinition::kExactSet : SurprisalDefinition::kGateWeightedLoad;
}

std::vector<double> routing_surprisal(const std::vector<LayerRouting>& layers, size_t tokens) {
  std::vector<double> surprisal(tokens, 0.0);
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerRouting& layer = layers[l];
    check_layer(layer, l, tokens);
    if (tokens == 0) continue;
    if (surprisal_definition(layer.top_k) == SurprisalDefinition::kExactSet) {
      add_exact_set_surprisal(layer, tokens, surprisal);
    } else {
      add_load_surprisal(layer, l, tokens, surprisal);
    }
  }
  return surprisal;
}

std::vector<double> token_rarity_surprisal(const std::vector<int32_t>& token_ids) {
  std::vector<double> surprisal(token_ids.size(), 0.0);
  add_type_surprisal(token_ids, surprisal);
  return surprisal;
}

std::vector<int> surprisal_outliers(const std::vector<double>& surprisal, double threshold) {
  if (!std::isfinite(threshold)) {
    fail(ErrorKind::kInvalidArgument, "surprisal outliers: threshold {} is not finite", threshold);
  }
  for (size_t t = 0; t < surprisal.size(); ++t) {
    if (!std::isfinite(surprisal[t])) {
      fail(ErrorKind::kInvalidArgument, "surprisal outliers: token {} has surprisal {}", t,
           surprisal[t]);
    }
  }
  if (surprisal.empty()) return {};
  const auto [lo, hi] = std::minmax_element(surprisal.begin(), surprisal.end());
  // Equal scores have no outliers; testing them against their rounded mean would let the rounding
  // decide for thresholds below 1.
  if (*lo == *hi) return {};
  const double n = static_cast<double>(surprisal.size());
  const double mean = std::accumulate(surprisal.begin(), surprisal.end(), 0.0) / n;
  double squares = 0.0;
  for (double s : surprisal) squares += (s - mean) * (s - mean);
  const double cut = mean + threshold * std::sqrt(squares / n);
  std::vector<int> outliers;
  for (size_t t = 0; t < surprisal.size(); ++t) {
    if (surprisal[t] > cut) outliers.push_back(static_cast<int>(t));
  }
  std::sort(outliers.begin(), outliers.end(), [&](int a, int b) {
    return surprisal[a] != surprisal[b] ? surprisal[a] > surprisal[b] : a < b;
  });
  return outliers;
}

std::vector<double> span_mean(const std::vector<double>& surprisal, int span) {
  if (span < 0) fail(ErrorKind::kInvalidArgument, "surprisal reserve: span {} is negative", span);
  if (span == 0) return surprisal;
  // Prefix sums in token order, so every window's sum is the same whatever the span.
  std::vector<double> prefix(surprisal.size() + 1, 0.0);
  for (size_t t = 0; t < surprisal.size(); ++t) prefix[t + 1] = prefix[t] + surprisal[t];
  const size_t w = static_cast<size_t>(span);
  std::vector<double> mean(surprisal.size());
  for (size_t t = 0; t < surprisal.size(); ++t) {
    const size_t first = t >= w ? t - w : 0, end = std::min(surprisal.size(), t + w + 1);
    mean[t] = (prefix[end] - prefix[first]) / static_cast<double>(end - first);
  }
  return mean;
}

std::vector<int> reserve_candidates(const std::vector<double>& surprisal,
                                    const ReserveOptions& options) {
  return surprisal_outliers(span_mean(surprisal, options.span), options.threshold);
}

size_t reserve_limit(double cap, int room) {
  if (!(cap >= 0.0 && cap <= 1.0)) {
    fail(ErrorKind::kInvalidArgument, "surprisal reserve: cap {} is outside [0, 1]", cap);
  }
  if (room < 0) fail(ErrorKind::kInvalidArgument, "surprisal reserve: room {} is negative", room);
  return static_cast<size_t>(std::floor(cap * room + 1e-9));
}

std::vector<int> reserved_tokens(const std::vector<double>& surprisal, int room,
                                 const ReserveOptions& options) {
  const size_t limit = reserve_limit(options.cap, room);
  std::vector<int> reserved = reserve_candidates(surprisal, options);
  if (reserved.size() > limit) reserved.resize(limit);
  return reserved;
}

}  // namespace ekva
