#include "cli/policy_args.h"

#include <fmt/format.h>

namespace ekva::cli {

void add_policy_options(CLI::App* cmd, PolicyArgs& args) {
  cmd->add_option("--policy", args.policy,
                  fmt::format("KV policy: {}", fmt::join(KvPolicy::names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--kv-budget", args.kv_budget,
                  "KV kept per (layer, KV head): a fraction of the prompt (0.25) or tokens (512)")
      ->capture_default_str();
  cmd->add_option("--plan", args.plan,
                  "BudgetPlan JSON for policies ekva, ekva-random-groups, ekva-nogroup");
  cmd->add_option("--window", args.window,
                  "Recent tokens always kept (SnapKV's observation window)")
      ->capture_default_str();
  cmd->add_option("--sinks", args.sinks, "Attention-sink tokens kept by policy streaming")
      ->capture_default_str();
}

PolicyOptions make_policy_options(const PolicyArgs& args, const ModelSpec& spec) {
  PolicyOptions o;
  o.name = args.policy;
  o.budget = args.kv_budget;
  o.window = args.window;
  o.sinks = args.sinks;
  o.refresh = args.refresh;
  if (!args.plan.empty()) {
    o.plan = BudgetPlan::load(args.plan);
    o.plan->check_model(spec);
  }
  return o;
}

}  // namespace ekva::cli
