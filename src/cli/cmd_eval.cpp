#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/policy_args.h"
#include "eval/evaluate.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

struct EvalArgs {
  std::string model_dir;
  std::vector<std::string> policies{"full"};
  std::vector<double> budgets{1.0};
  std::vector<std::string> tasks{"passkey", "kv-retrieval"};
  size_t context = 4096;
  int samples = 20;
  uint64_t seed = 777001;
  std::string plan;
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  const auto model = Model::load(a.model_dir);
  const auto tokenizer = load_tokenizer(a.model_dir);
  TaskEvalOptions options;
  for (const auto& name : a.tasks) options.tasks.push_back(parse_task_name(name));
  for (const auto& name : a.policies) {
    for (double budget : a.budgets) {
      PolicyArgs p;
      p.policy = name;
      p.kv_budget = budget;
      p.plan = a.plan;
      options.policies.push_back(make_policy_options(p, model->spec()));
    }
  }
  options.context_tokens = a.context;
  options.samples = a.samples;
  options.seed = a.seed;
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  if (a.json) {
    nlohmann::json results = nlohmann::json::array();
    for (const auto& s : scores) {
      results.push_back({{"task", task_name(s.task)},
                         {"policy", s.policy},
                         {"budget", s.budget},
                         {"score", s.score},
                         {"samples", s.samples},
                         {"kv_fraction", s.kv_fraction}});
    }
    fmt::print(
        "{}\n",
        nlohmann::json{
            {"model", a.model_dir}, {"context", a.context}, {"seed", a.seed}, {"results", results}}
            .dump());
    return 0;
  }
  fmt::print("{:<20} {:<20} {:>8} {:>7} {:>8} {:>8}\n", "task", "policy", "budget", "score",
             "samples", "kv");
  for (const auto& s : scores) {
    fmt::print("{:<20} {:<20} {:>8.3f} {:>7.3f} {:>8} {:>8.3f}\n", task_name(s.task), s.policy,
               s.budget, s.score, s.samples, s.kv_fraction);
  }
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Score long-context tasks (greedy, exact answer) under KV-cache policies and budgets");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("--model", a->model_dir, "Model directory (config, weights, tokenizer)")
      ->required();
  cmd->add_option("--policies", a->policies, "Comma-separated KV policies")->delimiter(',');
  cmd->add_option("--budgets", a->budgets,
                  "Comma-separated budgets: <= 1 a fraction of the prompt, > 1 tokens per head")
      ->delimiter(',');
  cmd->add_option("--tasks", a->tasks, "Comma-separated tasks (see ekva tasks)")->delimiter(',');
  cmd->add_option("--context", a->context, "Tokens of each sample: prompt plus answer room")
      ->check(CLI::Range(64, 1 << 24));
  cmd->add_option("--samples", a->samples, "Instances per task")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", a->seed, "Seed of the instance set (777001: the shipped eval set)");
  cmd->add_option("--plan", a->plan, "BudgetPlan JSON for the ekva policies");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([&action, a] { action = [a] { return run_eval(*a); }; });
}

}  // namespace ekva::cli
