#include "arch/router.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {

Router::Router(int num_experts, int top_k, bool renormalise)
    : num_experts_(num_experts),
      top_k_(top_k),
      renormalise_(renormalise),
      prob_(num_experts),
      order_(num_experts) {
  if (num_experts < 1 || top_k < 1 || top_k > num_experts) {
    fail(ErrorKind::kInvalidArgument, "router: top-{} of {} experts", top_k, num_experts);
  }
}

void Router::route(const float* logits, int32_t* experts, float* gates) {
  // A logit of a diverged hidden state is taken as the nearest finite value, NaN as the lowest, so
  // that the probabilities stay numbers: the sort's order stays strict and the picks are experts.
  for (int e = 0; e < num_experts_; ++e) {
    prob_[e] = std::fmin(std::fmax(logits[e], -FLT_MAX), FLT_MAX);
  }
  const float mx = *std::max_element(prob_.begin(), prob_.end());
  float sum = 0.0f;
  for (int e = 0; e < num_experts_; ++e) sum += prob_[e] = std::exp(prob_[e] - mx);
  for (int e = 0; e < num_experts_; ++e) prob_[e] /= sum;
  std::iota(order_.begin(), order_.end(), 0);
  std::partial_sort(order_.begin(), order_.begin() + top_k_, order_.end(), [&](int a, int b) {
    return prob_[a] > prob_[b] || (prob_[a] == prob_[b] && a < b);
  });
  float top_sum = 0.0f;
  for (int i = 0; i < top_k_; ++i) top_sum += prob_[order_[i]];
  for (int i = 0; i < top_k_; ++i) {
    const int e = order_[i];
    experts[i] = e;
    gates[i] = renormalise_ ? prob_[e] / top_sum : prob_[e];
  }
}

}  // namespace ekva
