#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "budget/allocator.h"
#include "budget/calibration.h"
#include "cli/commands.h"
#include "core/error.h"
#include "model/model.h"

namespace ekva::cli {
namespace {

struct PlanArgs {
  std::string stats;
  double budget = 0.2;
  std::string allocator = "greedy";
  std::string scope = "joint";
  double floor = 0.0;
  int groups = 0;
  ReserveOptions reserve;
  std::string model_dir;
  std::string out;
  bool json = false;
};

int run_plan(const PlanArgs& a) {
  const CalibrationStats stats = CalibrationStats::load(a.stats);
  if (!a.model_dir.empty()) stats.check_model(Model::load(a.model_dir)->spec());
  PlanOptions o;
  o.allocator = parse_allocator(a.allocator);
  o.scope = parse_scope(a.scope);
  o.budget = a.budget;
  o.floor = a.floor;
  o.groups = a.groups;
  if (!std::isfinite(a.reserve.threshold)) {
    fail(ErrorKind::kInvalidArgument, "--reserve-threshold: {} is not a finite number",
         a.reserve.threshold);
  }
  if (!(a.reserve.cap >= 0.0 && a.reserve.cap <= 1.0)) {
    fail(ErrorKind::kInvalidArgument, "--reserve-cap: {} is not in [0, 1]", a.reserve.cap);
  }
  BudgetPlan plan = make_plan(stats, o);
  plan.reserve = a.reserve;
  plan.provenance["stats_file"] = a.stats;
  plan.save(a.out);
  if (a.json) {
    fmt::print("{}\n", nlohmann::json{{"out", a.out}, {"provenance", plan.provenance}}.dump());
  } else {
    fmt::print(
        "{} plan ({} scope) at budget {}: predicted retained attention mass {:.3f}; wrote {}\n",
        a.allocator, a.scope, a.budget, plan.provenance["predicted_retained_mass"].get<double>(),
        a.out);
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("plan", "Turn calibration statistics into a BudgetPlan");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--stats", a->stats, "Statistics from ekva calibrate")->required();
  cmd->add_option("--budget", a->budget, "Per (layer, KV head): a fraction (0.2) or tokens (512)")
      ->required();
  cmd->add_option("--allocator", a->allocator, "uniform, pyramid, proportional or greedy")
      ->capture_default_str();
  cmd->add_option("--scope", a->scope, "layer, head, expert or joint")->capture_default_str();
  cmd->add_option("--floor", a->floor, "Least budget of each group, in the budget's unit")
      ->capture_default_str();
  cmd->add_option("--groups", a->groups, "Expert groups per layer (0: one per expert)")
      ->capture_default_str();
  cmd->add_option("--reserve-threshold", a->reserve.threshold,
                  "ekva's surprisal reserve, stored in the plan: outliers lie this many standard "
                  "deviations above the mean")
      ->capture_default_str();
  cmd->add_option("--reserve-cap", a->reserve.cap,
                  "... and take at most this share of a head's room")
      ->capture_default_str();
  cmd->add_option("--reserve-span", a->reserve.span,
                  "... after each token's surprisal is averaged over this many positions either "
                  "side (0: per token)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--model", a->model_dir, "Check the statistics against this model");
  cmd->add_option("--out", a->out, "BudgetPlan JSON to write")->required();
  cmd->add_flag("--json", a->json, "Print a JSON summary");
  cmd->callback([&action, a] { action = [a] { return run_plan(*a); }; });
}

}  // namespace ekva::cli
