#pragma once
// The one meaning of a KV budget. Policies, `roofline --plan` and device selection all turn a
// BudgetPlan and/or a --budget into absolute token counts here:
// - a budget <= 1 is a fraction of the prompt, > 1 tokens, per (layer, KV head) on average;
// - a plan alone keeps its own per-(layer, KV head) budgets at this prompt length;
// - a plan with a budget keeps the plan's relative shares, rescaled to that mean;
// - neither keeps everything;
// - a plan's sink and recent tokens are kept on top of the budgets.
// Counts are integers that sum exactly to the requested total, each at least 1 and at most the
// model's context, so that no budget can wrap.
#include <cstdint>
#include <optional>
#include <vector>

#include "arch/model_spec.h"
#include "kv/budget_plan.h"

namespace ekva {

struct KvBudgets {
  std::vector<int> head;  // [layer][kv head]: tokens kept besides the plan's sinks and recent
  int sinks = 0;          // the plan's first tokens, on top
  int recent = 0;         // the plan's most recent tokens, on top

  int at(int layer, int kv_head, int num_kv_heads) const {
    return head[static_cast<size_t>(layer) * num_kv_heads + kv_head];
  }
};

// Throws kInvalidArgument for a budget that is not a positive finite number.
KvBudgets resolve_budgets(const ModelSpec& spec, const BudgetPlan* plan,
                          std::optional<double> budget, int64_t prompt_len);

// The mean tokens per (layer, KV head) a budget asks for at this prompt length, in [1, context].
int mean_head_budget(const ModelSpec& spec, double budget, int64_t prompt_len);

// Splits `total` into integers proportional to `weights` that sum exactly to `total` (largest
// remainder; equal shares when every weight is 0).
std::vector<int> apportion(int64_t total, const std::vector<double>& weights);

}  // namespace ekva
