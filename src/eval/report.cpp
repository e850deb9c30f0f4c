#include "eval/report.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "eval/metrics.h"

namespace ekva {
namespace {

const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

std::vector<IsoQualityRow> iso_quality(const std::vector<TaskScore>& scores,
                                       const std::vector<double>& shares) {
  std::vector<std::string> tasks, policies;
  for (const TaskScore& s : scores) {
    if (std::find(tasks.begin(), tasks.end(), s.task) == tasks.end()) tasks.push_back(s.task);
    if (s.policy != "full" &&
        std::find(policies.begin(), policies.end(), s.policy) == policies.end())
      policies.push_back(s.policy);
  }
  std::vector<IsoQualityRow> rows;
  for (const std::string& task : tasks) {
    const auto full = std::find_if(scores.begin(), scores.end(), [&](const TaskScore& s) {
      return s.task == task && s.policy == "full";
    });
    if (full == scores.end()) {
      fail(ErrorKind::kInvalidArgument, "iso-quality: task {} has no full-KV score to compare with",
           task);
    }
    for (const std::string& policy : policies) {
      std::vector<const TaskScore*> of_policy;
      std::vector<QualityPoint> points;
      for (const TaskScore& s : scores) {
        if (s.task != task || s.policy != policy) continue;
        of_policy.push_back(&s);
        points.push_back({s.budget, s.quality, s.kv_bytes, s.kv_fraction});
      }
      if (points.empty()) continue;
      for (double share : shares) {
        IsoQualityRow row{task, policy, share, full->quality, std::nullopt};
        if (const auto i = smallest_budget_keeping(points, full->quality, share))
          row.at = *of_policy[*i];
        rows.push_back(std::move(row));
      }
    }
  }
  return rows;
}

std::vector<PairedRow> paired_comparisons(const std::vector<TaskScore>& scores) {
  std::vector<std::pair<std::string, double>> cells;  // (task, budget), first appearance first
  for (const TaskScore& s : scores) {
    const std::pair<std::string, double> cell{s.task, s.budget};
    if (s.policy != "full" && std::find(cells.begin(), cells.end(), cell) == cells.end())
      cells.push_back(cell);
  }
  const auto& blind = expert_blind_policies();
  std::vector<PairedRow> rows;
  for (const auto& [task, budget] : cells) {
    std::vector<const TaskScore*> in_cell;
    const TaskScore* best = nullptr;
    for (const TaskScore& s : scores) {
      if (s.task != task || s.budget != budget || s.policy == "full") continue;
      if (s.sample_values.empty() ||
          (!in_cell.empty() && s.sample_values.size() != in_cell.front()->sample_values.size())) {
        fail(ErrorKind::kInvalidArgument, "paired test: {} at {:g} on {} has {} samples{}",
             s.policy, budget, task, s.sample_values.size(),
             in_cell.empty() ? ""
                             : fmt::format(", {} has {}", in_cell.front()->policy,
                                           in_cell.front()->sample_values.size()));
      }
      in_cell.push_back(&s);
      const bool is_blind = std::find(blind.begin(), blind.end(), s.policy) != blind.end();
      if (is_blind && (best == nullptr || s.quality > best->quality)) best = &s;
    }
    if (best == nullptr) continue;
    // Perplexity windows compare by NLL per token, lower being better.
    const auto per_sample = [](const TaskScore& s) {
      std::vector<double> v = s.sample_values;
      for (size_t i = 0; i < s.sample_tokens.size(); ++i) v[i] /= std::max(s.sample_tokens[i], 1);
      return v;
    };
    const std::vector<double> reference = per_sample(*best);
    for (const TaskScore* s : in_cell) {
      if (s == best) continue;
      rows.push_back({task, budget, s->policy, best->policy, s->score, best->score,
                      paired_exact_test(per_sample(*s), reference, s->sample_tokens.empty())});
    }
  }
  return rows;
}

nlohmann::json score_json(const TaskScore& s) {
  nlohmann::json j = {{"task", s.task},
                      {"policy", s.policy},
                      {"budget", s.budget},
                      {"score", s.score},
                      {"ci95", {s.interval.low, s.interval.high}},
                      {"quality", s.quality},
                      {"samples", s.samples},
                      {"kv_bytes", s.kv_bytes},
                      {"kv_bytes_full", s.kv_bytes_full},
                      {"kv_fraction", s.kv_fraction}};
  // Per sample, in instance order, so that any two policies can be paired later.
  if (s.sample_tokens.empty()) {
    std::vector<int> correct;
    for (double v : s.sample_values) correct.push_back(v != 0.0);
    j["correct"] = correct;
  } else {
    j["nll"] = s.sample_values;
    j["tokens"] = s.sample_tokens;
  }
  return j;
}

nlohmann::json paired_json(const std::vector<PairedRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const PairedRow& r : rows) {
    out.push_back({{"task", r.task},
                   {"budget", r.budget},
                   {"policy", r.policy},
                   {"baseline", r.baseline},
                   {"score", r.score},
                   {"baseline_score", r.baseline_score},
                   {"policy_better", r.test.first_better},
                   {"baseline_better", r.test.second_better},
                   {"p_value", r.test.p_value}});
  }
  return out;
}

nlohmann::json iso_quality_json(const std::vector<IsoQualityRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const IsoQualityRow& r : rows) {
    nlohmann::json j = {{"task", r.task},
                        {"policy", r.policy},
                        {"share", r.share},
                        {"full_quality", r.full_quality}};
    if (r.at) {
      j["budget"] = r.at->budget;
      j["score"] = r.at->score;
      j["ci95"] = {r.at->interval.low, r.at->interval.high};
      j["kv_bytes"] = r.at->kv_bytes;
      j["kv_fraction"] = r.at->kv_fraction;
    } else {
      j["budget"] = nullptr;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::string results_csv(const std::vector<TaskScore>& scores) {
  std::string csv =
      "task,policy,budget,score,ci95_low,ci95_high,quality,samples,kv_bytes,kv_bytes_full,"
      "kv_fraction\n";
  for (const TaskScore& s : scores) {
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n", s.task, s.policy, s.budget, s.score,
                       s.interval.low, s.interval.high, s.quality, s.samples, s.kv_bytes,
                       s.kv_bytes_full, s.kv_fraction);
  }
  return csv;
}

std::string paired_csv(const std::vector<PairedRow>& rows) {
  std::string csv =
      "task,budget,policy,baseline,score,baseline_score,policy_better,baseline_better,p_value\n";
  for (const PairedRow& r : rows) {
    csv +=
        fmt::format("{},{},{},{},{},{},{},{},{}\n", r.task, r.budget, r.policy, r.baseline, r.score,
                    r.baseline_score, r.test.first_better, r.test.second_better, r.test.p_value);
  }
  return csv;
}

std::string paired_markdown(const std::vector<PairedRow>& rows) {
  std::string md =
      "| task | budget | policy | score | best expert-blind | its score | policy better | "
      "baseline better | p (exact) |\n| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: "
      "|\n";
  for (const PairedRow& r : rows) {
    md += fmt::format("| {} | {:g} | {} | {:.4g} | {} | {:.4g} | {} | {} | {:.3g} |\n", r.task,
                      r.budget, r.policy, r.score, r.baseline, r.baseline_score,
                      r.test.first_better, r.test.second_better, r.test.p_value);
  }
  return md;
}

std::string score_chart_svg(const std::string& task, const std::vector<TaskScore>& scores) {
  constexpr double kWidth = 640, kHeight = 400, kLeft = 60, kRight = 170, kTop = 40, kBottom = 50;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  std::map<std::string, std::vector<const TaskScore*>> by_policy;
  std::vector<std::string> order;
  double y_max = 0.0;
  for (const TaskScore& s : scores) {
    if (s.task != task) continue;
    if (!by_policy.count(s.policy)) order.push_back(s.policy);
    by_policy[s.policy].push_back(&s);
    y_max = std::max({y_max, s.score, s.interval.high});
  }
  if (order.empty()) fail(ErrorKind::kInvalidArgument, "chart: no scores of task {}", task);
  const bool accuracy = task != "ppl";
  if (accuracy || y_max <= 0) y_max = 1.0;
  auto x_of = [&](double fraction) { return kLeft + plot_w * std::clamp(fraction, 0.0, 1.0); };
  auto y_of = [&](double v) { return kTop + plot_h * (1.0 - std::clamp(v / y_max, 0.0, 1.0)); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"15\">{}: {} against KV kept</text>\n",
      kWidth, kHeight, kLeft, task, accuracy ? "accuracy" : "perplexity");
  for (int i = 0; i <= 4; ++i) {
    const double f = i / 4.0;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n"
        "<line x1=\"{5}\" y1=\"{6}\" x2=\"{7}\" y2=\"{6}\" stroke=\"#ddd\"/>"
        "<text x=\"{8}\" y=\"{9}\" text-anchor=\"end\">{10:.3g}</text>\n",
        x_of(f), kTop, kTop + plot_h, kTop + plot_h + 16, f, kLeft, y_of(f * y_max), kLeft + plot_w,
        kLeft - 6, y_of(f * y_max) + 4, f * y_max);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">KV bytes kept / full</text>\n"
      "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>\n",
      kLeft + plot_w / 2, kHeight - 12, kTop + plot_h / 2, kTop + plot_h / 2,
      accuracy ? "accuracy (95% Wilson interval)" : "perplexity");
  for (size_t p = 0; p < order.size(); ++p) {
    const std::string& colour = kColours[p % std::size(kColours)];
    std::vector<const TaskScore*> points = by_policy[order[p]];
    std::sort(points.begin(), points.end(), [](const TaskScore* a, const TaskScore* b) {
      return a->kv_fraction < b->kv_fraction;
    });
    if (order[p] == "full") {
      svg += fmt::format(
          "<line x1=\"{0}\" y1=\"{2}\" x2=\"{1}\" y2=\"{2}\" stroke=\"{3}\" "
          "stroke-dasharray=\"6 4\"/>\n",
          kLeft, kLeft + plot_w, y_of(points.front()->score), colour);
    } else {
      std::string line;
      for (const TaskScore* s : points)
        line += fmt::format("{:.1f},{:.1f} ", x_of(s->kv_fraction), y_of(s->score));
      svg +=
          fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                      line, colour);
    }
    for (const TaskScore* s : points) {
      const double x = x_of(s->kv_fraction);
      svg += fmt::format(
          "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"{3}\" "
          "stroke-opacity=\"0.5\"/><circle cx=\"{0:.1f}\" cy=\"{4:.1f}\" r=\"3\" fill=\"{3}\"/>\n",
          x, y_of(s->interval.low), y_of(s->interval.high), colour, y_of(s->score));
    }
    const double ly = kTop + 14.0 * p + 6;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        kLeft + plot_w + 12, ly, kLeft + plot_w + 30, colour, kLeft + plot_w + 36, ly + 4,
        order[p]);
  }
  return svg + "</svg>\n";
}

}  // namespace ekva
