#pragma once
// What an evaluation reports: the iso-quality table, paired tests against the best expert-blind
// policy, results as JSON, CSV and markdown, and one SVG chart of score against budget per task.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/evaluate.h"
#include "eval/metrics.h"

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

// The policies that rank tokens without looking at expert routing; the paired tests compare every
// other policy with the best of these.
inline const std::vector<std::string>& expert_blind_policies() {
  static const std::vector<std::string> names = {
      "streaming", "h2o", "snapkv", "pyramidkv", "adakv", "keydiff", "rarity-tokens"};
  return names;
}

// One policy against the best expert-blind policy (highest accuracy, lowest perplexity; the first
// listed on a tie) on the same samples of one (task, budget): McNemar's exact test on answers,
// the exact sign test on per-window NLL per token for ppl.
struct PairedRow {
  std::string task;
  double budget = 0.0;
  std::string policy;
  std::string baseline;
  double score = 0.0;
  double baseline_score = 0.0;
  PairedTest test;  // first: the policy, second: the baseline
};

// Rows per (task, budget) with an expert-blind policy, for every other policy except full, in the
// order of the scores. Throws kInvalidArgument when two policies of a (task, budget) hold different
// numbers of samples, or none.
std::vector<PairedRow> paired_comparisons(const std::vector<TaskScore>& scores);

nlohmann::json score_json(const TaskScore& score);
nlohmann::json iso_quality_json(const std::vector<IsoQualityRow>& rows);
nlohmann::json paired_json(const std::vector<PairedRow>& rows);
std::string results_csv(const std::vector<TaskScore>& scores);
std::string paired_csv(const std::vector<PairedRow>& rows);
// A markdown table of the rows (p to three significant digits).
std::string paired_markdown(const std::vector<PairedRow>& rows);
// Score (ppl: perplexity) against KV fraction kept, one polyline per policy; the full cache is a
// horizontal reference line.
std::string score_chart_svg(const std::string& task, const std::vector<TaskScore>& scores);

}  // namespace ekva
