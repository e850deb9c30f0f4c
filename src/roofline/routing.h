#pragma once
// How many distinct experts a step's tokens touch at each MoE layer: every touched expert's
// weights are read once per step, so this (not top_k) sets the expert bytes of a decode step.
#include <filesystem>
#include <string>
#include <vector>

#include "arch/model_spec.h"

namespace ekva {

// Each of `tokens` tokens picks top_k of `experts` uniformly: E·(1 − (1 − k/E)^tokens).
double expected_distinct_experts(int experts, int top_k, double tokens);

class RoutingModel {
 public:
  RoutingModel() = default;  // uniform routing
  // counts[layer][expert]: measured (token, expert) assignments; one row per layer, empty for
  // layers without a router. `source` names the data in errors.
  static RoutingModel from_counts(const ModelSpec& spec,
                                  const std::vector<std::vector<double>>& counts,
                                  const std::string& source);
  // Calibration statistics (`ekva calibrate`: their top-k routing counts), or
  // {"expert_counts": [[...], ...]} (schema in docs/ROOFLINE.md).
  static RoutingModel load(const std::filesystem::path& path, const ModelSpec& spec);

  bool is_uniform() const { return selection_probability_.empty(); }
  // Expected distinct experts of `layer` that `tokens` independently routed tokens touch.
  double experts_touched(const ModelSpec& spec, int layer, double tokens) const;

 private:
  // [layer][expert]: probability that a token's top-k contains the expert.
  std::vector<std::vector<double>> selection_probability_;
};

}  // namespace ekva
