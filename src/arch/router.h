#pragma once
// Router math of every supported architecture: softmax over the experts' logits, the top-k experts
// (ties to the lower id), gates optionally renormalised over the top-k (norm_topk_prob). Every
// backend and the reference forward route with it, so that they pick the same experts.
#include <cstdint>
#include <vector>

namespace ekva {

class Router {
 public:
  Router(int num_experts, int top_k, bool renormalise);
  // One token: experts[top_k] best first and their gates[top_k].
  void route(const float* logits, int32_t* experts, float* gates);

 private:
  int num_experts_;
  int top_k_;
  bool renormalise_;
  std::vector<float> prob_;
  std::vector<int> order_;
};

}  // namespace ekva
