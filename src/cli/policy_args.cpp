#include "cli/policy_args.h"

#include <fmt/format.h>

namespace ekva::cli {

void add_policy_options(CLI::App* cmd, PolicyArgs& args) {
  cmd->add_option("--policy", args.policy,
                  fmt::format("KV policy: {}", fmt::join(KvPolicy::names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--budget", args.budget,
                  "KV kept per (layer, KV head): a fraction of the prompt (0.25) or tokens "
                  "(512); with --plan it rescales the plan (default: the plan's own budgets, or "
                  "everything)");
  cmd->add_option_function<double>(
         "--kv-budget",
         [&args](double b) {
           fmt::print(stderr, "ekva: note: --kv-budget is deprecated; use --budget\n");
           args.budget = b;
         },
         "Deprecated spelling of --budget")
      ->group("");
  add_shared_policy_options(cmd, args);
}

void add_shared_policy_options(CLI::App* cmd, PolicyArgs& args) {
  cmd->add_option("--plan", args.plan,
                  "BudgetPlan JSON for policies ekva, ekva-quota, ekva-random-groups, "
                  "ekva-nogroup, ekva-online, rarity-tokens");
  cmd->add_option("--window", args.window,
                  "Recent tokens always kept (SnapKV's observation window)")
      ->capture_default_str();
  cmd->add_option("--sinks", args.sinks, "Attention-sink tokens kept by policy streaming")
      ->capture_default_str();
  cmd->add_option("--reserve-threshold", args.reserve.threshold,
                  fmt::format("ekva, ekva-random-groups, rarity-tokens: tokens whose surprisal "
                              "exceeds the mean by this many standard deviations are kept first "
                              "(default: the plan's, else {:g})",
                              ReserveOptions{}.threshold));
  cmd->add_option("--reserve-cap", args.reserve.cap,
                  fmt::format("... at most this share of a head's room (after the recent window; "
                              "default: the plan's, else {:g})",
                              ReserveOptions{}.cap));
  cmd->add_option("--reserve-span", args.reserve.span,
                  fmt::format("... each token's surprisal averaged over this many positions either "
                              "side first (0: per token; default: the plan's, else {})",
                              ReserveOptions{}.span))
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-dtype", args.kv_dtype,
                  "Element type of the stored K and V: f32 or bf16 (default: f32 on the CPU, bf16 "
                  "on the GPU)")
      ->check(CLI::IsMember({"f32", "bf16"}));
}

KvFormat kv_format(const PolicyArgs& args) {
  KvFormat f;
  f.dtype = args.kv_dtype == "bf16" ? DType::kBF16 : DType::kF32;
  return f;
}

PolicyOptions make_policy_options(const PolicyArgs& args, const ModelSpec& spec) {
  PolicyOptions o;
  o.name = args.policy;
  o.budget = args.budget;
  o.window = args.window;
  o.sinks = args.sinks;
  o.refresh = args.refresh;
  o.reserve = args.reserve;
  if (!args.plan.empty()) {
    o.plan = BudgetPlan::load(args.plan);
    o.plan->check_model(spec);
  }
  return o;
}

}  // namespace ekva::cli
