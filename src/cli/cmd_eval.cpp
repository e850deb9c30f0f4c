#include <fmt/core.h>
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_args.h"
#include "cli/policy_args.h"
#include "eval/evaluate.h"
#include "eval/report.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/repository.h"
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
  std::string mode = "aware";
  std::string filler;
  std::string heldout = "data/eval/heldout.txt";
  int ppl_tokens = 128;
  int jobs = 1;
  PolicyArgs kv;  // --plan, --window, --sinks; --policies and --budgets give the rest
  DeviceArgs device;
  std::string out;
  bool json = false;
};

const std::vector<double> kIsoShares = {0.99, 0.95};

std::string iso_cell(const IsoQualityRow& r) {
  if (!r.at) return "not reached";
  return fmt::format("{:g} ({:.1f}% KV, {:.3g} [{:.3g}, {:.3g}])", r.at->budget,
                     100 * r.at->kv_fraction, r.at->score, r.at->interval.low, r.at->interval.high);
}

int run_eval(const EvalArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  if (!a.out.empty()) check_output_directory(a.out);
  const auto model = Model::load(a.model_dir);
  const auto tokenizer = load_tokenizer(a.model_dir);
  TaskEvalOptions options;
  bool ppl = false;
  for (const auto& name : a.tasks) {
    options.tasks.push_back(parse_eval_task(name));
    ppl = ppl || !options.tasks.back().kind;
  }
  // The full cache is the iso-quality reference: always run, once (every budget keeps it all).
  PolicyArgs full = a.kv;
  full.policy = "full";
  full.plan.clear();
  options.policies.push_back(make_policy_options(full, model->spec()));
  for (const auto& name : a.policies) {
    if (name == "full") continue;
    for (double budget : a.budgets) {
      PolicyArgs p = a.kv;
      p.policy = name;
      p.budget = budget;
      options.policies.push_back(make_policy_options(p, model->spec()));
    }
  }
  options.context_tokens = a.context;
  options.samples = a.samples;
  options.seed = a.seed;
  options.mode = parse_query_mode(a.mode);
  if (!a.filler.empty()) options.filler = read_filler(repository_path(a.filler));
  if (ppl) options.heldout_text = read_text_file(repository_path(a.heldout));
  options.ppl_tokens = a.ppl_tokens;
  options.jobs = a.jobs;
  options.engine.kv = kv_format(a.kv);
  const std::string device = use_device(a.device, a.kv.kv_dtype, options.engine);
  options.progress = [](int done, int total) {
    fmt::print(stderr, "\reval [{:<30}] {}/{} (sample x policy)",
               std::string(30 * done / total, '#'), done, total);
    if (done == total) fmt::print(stderr, "\n");
  };
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  const std::vector<IsoQualityRow> iso = iso_quality(scores, kIsoShares);
  const std::vector<PairedRow> paired = paired_comparisons(scores);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  nlohmann::json results = nlohmann::json::array();
  for (const auto& s : scores) results.push_back(score_json(s));
  const nlohmann::json report = {{"model", a.model_dir},
                                 {"device", device},
                                 {"context", a.context},
                                 {"samples", a.samples},
                                 {"seed", a.seed},
                                 {"mode", a.mode},
                                 {"filler", a.filler.empty() ? "noise" : a.filler},
                                 {"plan", a.kv.plan},
                                 {"ppl_tokens", a.ppl_tokens},
                                 {"wall_seconds", seconds},
                                 {"results", results},
                                 {"iso_quality", iso_quality_json(iso)},
                                 {"paired", paired_json(paired)}};
  if (!a.out.empty()) {
    std::vector<std::pair<std::string, std::string>> files = {
        {"results.json", report.dump(2) + "\n"},
        {"results.csv", results_csv(scores)},
        {"paired.csv", paired_csv(paired)},
        {"paired.md", paired_markdown(paired)}};
    for (const auto& task : options.tasks) {
      files.emplace_back(fmt::format("chart-{}.svg", task.name()),
                         score_chart_svg(std::string(task.name()), scores));
    }
    if (!a.kv.plan.empty()) files.emplace_back("plan.json", read_text_file(a.kv.plan));
    write_files_atomically(a.out, files);
  }
  if (a.json) {
    fmt::print("{}\n", report.dump());
    return 0;
  }
  fmt::print("{:<18} {:<19} {:>7} {:>8} {:>17} {:>7} {:>7}\n", "task", "policy", "budget", "score",
             "95% interval", "samples", "kv");
  for (const auto& s : scores) {
    fmt::print("{:<18} {:<19} {:>7.3g} {:>8.4g} {:>17} {:>7} {:>7.3f}\n", s.task, s.policy,
               s.budget, s.score, fmt::format("[{:.3g}, {:.3g}]", s.interval.low, s.interval.high),
               s.samples, s.kv_fraction);
  }
  fmt::print(
      "\nsmallest budget keeping >= 99% / >= 95% of full-KV quality (KV kept, score [95%]):\n");
  for (size_t i = 0; i + 1 < iso.size(); i += 2) {
    fmt::print("{:<18} {:<19} {:<40} {}\n", iso[i].task, iso[i].policy, iso_cell(iso[i]),
               iso_cell(iso[i + 1]));
  }
  if (!paired.empty()) {
    fmt::print("\npaired against the best expert-blind policy (exact McNemar; ppl: sign test):\n{}",
               paired_markdown(paired));
  }
  fmt::print("\nwall time {:.1f} s{}\n", seconds,
             a.out.empty() ? "" : fmt::format("; wrote {}", a.out));
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Score long-context tasks (greedy, exact answer) and held-out perplexity under KV-cache "
      "policies and budgets");
  auto a = std::make_shared<EvalArgs>();
  cmd->add_option("--model", a->model_dir, "Model directory (config, weights, tokenizer)")
      ->required();
  cmd->add_option("--policies", a->policies,
                  fmt::format("Comma-separated KV policies: {} (full always runs, as the "
                              "reference)",
                              fmt::join(KvPolicy::names(), ", ")))
      ->delimiter(',');
  cmd->add_option("--budgets", a->budgets,
                  "Comma-separated budgets: <= 1 a fraction of the prompt, > 1 tokens per head")
      ->delimiter(',');
  cmd->add_option("--tasks", a->tasks, "Comma-separated tasks (see ekva tasks) and/or ppl")
      ->delimiter(',');
  cmd->add_option("--context", a->context, "Tokens of each sample: prompt plus answer room")
      ->check(CLI::Range(64, 1 << 24));
  cmd->add_option("--samples", a->samples, "Instances (ppl: held-out windows) per task")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option(
      "--seed", a->seed,
      fmt::format("Seed of the instance set ({}: dev, tune on it; {}: test; 777001: the "
                  "first sweeps)",
                  kDevSeed, kTestSeed));
  cmd->add_option("--mode", a->mode,
                  "aware: compress after context and question; agnostic: compress the context, "
                  "then stream the question with eviction")
      ->capture_default_str();
  cmd->add_option("--filler", a->filler,
                  "Text file whose paragraphs hide the tasks' facts, e.g. data/eval/heldout.txt "
                  "(default: the repetitive noise sentences of the original passkey test)");
  cmd->add_option("--heldout", a->heldout, "ppl: held-out text the windows are cut from")
      ->capture_default_str();
  cmd->add_option("--ppl-tokens", a->ppl_tokens, "ppl: continuation tokens scored per window")
      ->capture_default_str();
  add_shared_policy_options(cmd, a->kv);
  add_device_option(cmd, a->device);
  cmd->add_option("--jobs", a->jobs,
                  "Samples evaluated at once, each on a thread with engines of its own (on the "
                  "GPU their kernels overlap); the results are the same for any number")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--out", a->out,
                  "Directory for results.json, results.csv, chart-TASK.svg and plan.json");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([&action, a] { action = [a] { return run_eval(*a); }; });
}

}  // namespace ekva::cli
