#pragma once
// From calibration statistics to a BudgetPlan: allocators (uniform, pyramid, proportional, greedy)
// over a scope (layer-only, head-only, expert-only, joint), and expert groups for many-expert
// models.
#include <string>
#include <vector>

#include "budget/calibration.h"
#include "kv/budget_plan.h"

namespace ekva {

enum class Allocator { kUniform, kPyramid, kProportional, kGreedy };
// What the allocator may vary; the rest is split evenly. kExpert keeps every (layer, head) at the
// mean budget and moves budget between its groups only.
enum class PlanScope { kLayer, kHead, kExpert, kJoint };

Allocator parse_allocator(const std::string& name);
PlanScope parse_scope(const std::string& name);
const char* allocator_name(Allocator a);
const char* scope_name(PlanScope s);

struct PlanOptions {
  Allocator allocator = Allocator::kGreedy;
  PlanScope scope = PlanScope::kJoint;
  double budget = 0.2;  // per (layer, KV head): a fraction of the prompt (<= 1) or tokens (> 1)
  double floor = 0.0;   // per group, in the budget's unit
  int groups = 0;       // expert groups per layer; 0: one per expert
};

// Experts of one layer merged into `groups` groups: the least-routed group joins the group it is
// most often co-routed with, until `groups` remain. Returns the group of each expert.
std::vector<int> coroute_groups(const CalibrationStats& stats, int layer, int groups);

// Throws kInvalidArgument when the budget cannot be met (floors above it, budget <= 0).
BudgetPlan make_plan(const CalibrationStats& stats, const PlanOptions& options);

}  // namespace ekva
