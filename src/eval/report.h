#pragma once
// What an evaluation reports: the iso-quality table, results as JSON and CSV, and one SVG chart of
// score against budget per task.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/evaluate.h"

namespace ekva {

// The least budget at which a policy keeps `share` of the full cache's quality on a task (and
// keeps it at every larger budget evaluated); `at` is that budget's score, empty when none does.
struct IsoQualityRow {
  std::string task;
  std::string policy;
  double share = 0.0;
  double full_quality = 0.0;
  std::optional<TaskScore> at;
};

// Rows per (task, non-full policy, share), in the order of first appearance. The reference is the
// "full" policy's score on the same task; throws kInvalidArgument when a task has none.
std::vector<IsoQualityRow> iso_quality(const std::vector<TaskScore>& scores,
                                       const std::vector<double>& shares);

nlohmann::json score_json(const TaskScore& score);
nlohmann::json iso_quality_json(const std::vector<IsoQualityRow>& rows);
std::string results_csv(const std::vector<TaskScore>& scores);
// Score (ppl: perplexity) against KV fraction kept, one polyline per policy; the full cache is a
// horizontal reference line.
std::string score_chart_svg(const std::string& task, const std::vector<TaskScore>& scores);

}  // namespace ekva
