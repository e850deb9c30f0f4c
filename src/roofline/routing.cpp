#include "roofline/routing.h"

#include <algorithm>
#include <cmath>

#include "budget/calibration.h"
#include "core/error.h"
#include "io/json_file.h"

namespace ekva {

double expected_distinct_experts(int experts, int top_k, double tokens) {
  if (experts <= 0 || top_k <= 0 || top_k > experts) {
    fail(ErrorKind::kInvalidArgument, "expected_distinct_experts: top_k {} of {} experts", top_k,
         experts);
  }
  if (tokens <= 0) return 0.0;
  const double e = experts;
  return e * (1.0 - std::pow(1.0 - top_k / e, tokens));
}

RoutingModel RoutingModel::from_counts(const ModelSpec& spec,
                                       const std::vector<std::vector<double>>& counts,
                                       const std::string& source) {
  if (static_cast<int>(counts.size()) != spec.num_layers) {
    fail(ErrorKind::kInvalidFile, "{}: {} rows of expert counts for a model of {} layers", source,
         counts.size(), spec.num_layers);
  }
  RoutingModel r;
  r.selection_probability_.resize(spec.num_layers);
  for (int l = 0; l < spec.num_layers; ++l) {
    const auto& row = counts[l];
    if (!spec.layer_is_moe[l]) {
      if (!row.empty())
        fail(ErrorKind::kInvalidFile, "{}: layer {} has no router but {} counts", source, l,
             row.size());
      continue;
    }
    if (static_cast<int>(row.size()) != spec.num_experts) {
      fail(ErrorKind::kInvalidFile, "{}: layer {} has {} counts for {} experts", source, l,
           row.size(), spec.num_experts);
    }
    double assignments = 0;
    for (double c : row) {
      if (!(c >= 0) || !std::isfinite(c))
        fail(ErrorKind::kInvalidFile, "{}: layer {} has a count {} (must be >= 0)", source, l, c);
      assignments += c;
    }
    if (assignments <= 0) fail(ErrorKind::kInvalidFile, "{}: layer {} counts sum to 0", source, l);
    // Each token makes top_k assignments to distinct experts, so count / tokens is the chance a
    // token selects the expert.
    const double tokens = assignments / spec.top_k;
    auto& p = r.selection_probability_[l];
    p.reserve(row.size());
    for (double c : row) p.push_back(std::min(1.0, c / tokens));
  }
  return r;
}

RoutingModel RoutingModel::load(const std::filesystem::path& path, const ModelSpec& spec) {
  const nlohmann::json j = read_json_file(path);
  const std::string source = path.string();
  const bool is_calibration = j.is_object() && j.contains("format") && j["format"].is_string() &&
                              j["format"].get<std::string>() == "ekva.calibration_stats";
  if (is_calibration) {
    const CalibrationStats stats = CalibrationStats::from_json(j, source);
    stats.check_model(spec);
    std::vector<std::vector<double>> counts(spec.num_layers);
    for (int l = 0; l < spec.num_layers; ++l) {
      if (!spec.layer_is_moe[l]) continue;
      for (int e = 0; e < spec.num_experts; ++e) {
        counts[l].push_back(stats.routing_topk[stats.le(l, e)]);
      }
    }
    return from_counts(spec, counts, source);
  }
  if (!j.is_object() || !j.contains("expert_counts") || !j["expert_counts"].is_array()) {
    fail(ErrorKind::kInvalidFile,
         "{}: expected calibration statistics (ekva calibrate) or an object with a list "
         "'expert_counts'",
         source);
  }
  std::vector<std::vector<double>> counts;
  for (const auto& row : j["expert_counts"]) {
    if (!row.is_array())
      fail(ErrorKind::kInvalidFile, "{}: expert_counts rows must be lists", source);
    std::vector<double> values;
    for (const auto& v : row) {
      if (!v.is_number())
        fail(ErrorKind::kInvalidFile, "{}: expert_counts holds a non-number {}", source,
             json_excerpt(v));
      values.push_back(v.get<double>());
    }
    counts.push_back(std::move(values));
  }
  return from_counts(spec, counts, source);
}

double RoutingModel::experts_touched(const ModelSpec& spec, int layer, double tokens) const {
  if (!spec.layer_is_moe[layer]) return 0.0;
  if (is_uniform()) return expected_distinct_experts(spec.num_experts, spec.top_k, tokens);
  if (tokens <= 0) return 0.0;
  double touched = 0;
  for (double p : selection_probability_[layer]) touched += 1.0 - std::pow(1.0 - p, tokens);
  return touched;
}

}  // namespace ekva
