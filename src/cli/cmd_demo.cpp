// `ekva demo`: the project's main job in one command. On the embedded model it calibrates on text
// disjoint from the evaluation data, makes a greedy plan, answers one long-context passkey
// question with the full cache, with EKVA and with baselines at the same budget, and prints what
// each kept.
#include <fmt/core.h>

#include <chrono>
#include <filesystem>

#include "budget/allocator.h"
#include "budget/calibration.h"
#include "cli/commands.h"
#include "cli/device_args.h"
#include "core/error.h"
#include "eval/evaluate.h"
#include "io/json_file.h"
#include "io/repository.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

namespace fs = std::filesystem;

struct DemoArgs {
  std::string model_dir = "models/ekva-moe-8m";
  std::string calibration = "data/calibration/heldout-calibration.txt";
  int calibration_tokens = 2048;
  size_t context = 2048;
  double budget = 0.2;
  uint64_t seed = 777001;
  std::vector<std::string> baselines{"snapkv", "streaming"};
  DeviceArgs device;
};

std::string mib(double bytes) {
  return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0));
}

int run_demo(const DemoArgs& a) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const fs::path model_dir = repository_path(a.model_dir);
  const auto model = Model::load(model_dir);
  const auto tokenizer = load_tokenizer(model_dir);
  const ModelSpec& spec = model->spec();
  if (!spec.bos_id) fail(ErrorKind::kInvalidFile, "{}: no bos_token_id", model_dir.string());

  // 1. Calibration on held-out text that the evaluation never uses (data/calibration/README.md).
  const fs::path calibration_file = repository_path(a.calibration);
  const std::vector<int32_t> ids = tokenizer->encode(read_text_file(calibration_file), false);
  EngineOptions engine_options;
  const std::string device = use_device(a.device, "", engine_options);
  CalibrationOptions calibration_options;
  calibration_options.engine = engine_options;
  const auto chunks =
      calibration_chunks(ids, calibration_options.chunk_tokens, a.calibration_tokens);
  const size_t chunk = calibration_options.chunk_tokens;
  fmt::print(stderr, "[1/3] calibrating {} on {} tokens of {}\n", model_dir.filename().string(),
             chunks.size() * chunk, calibration_file.filename().string());
  const CalibrationStats stats = calibrate(*model, chunks, calibration_options);

  // 2. A greedy plan over (layer, KV head, expert) at the demo's budget.
  PlanOptions plan_options;
  plan_options.budget = a.budget;
  const BudgetPlan plan = make_plan(stats, plan_options);
  fmt::print(stderr, "[2/3] greedy plan at budget {} ({:.1f} s so far)\n", a.budget, elapsed());

  // 3. One passkey instance, answered under every policy from one shared prefill per scoring set.
  TaskOptions task_options;
  task_options.prompt_tokens = a.context - kAnswerRoom - 1;
  const TaskInstance instance =
      generate_task(TaskKind::kPasskey, instance_seed(a.seed, 0), task_options,
                    [&](const std::string& text) { return tokenizer->encode(text, false).size(); });
  const auto [prefix, suffix] =
      instance_tokens(instance, *tokenizer, *spec.bos_id, QueryMode::kAware);
  std::vector<PolicyOptions> policies(1);  // full
  PolicyOptions ekva;
  ekva.name = "ekva";
  ekva.budget = a.budget;
  ekva.plan = plan;
  policies.push_back(ekva);
  for (const std::string& name : a.baselines) {
    PolicyOptions baseline;
    baseline.name = name;
    baseline.budget = a.budget;
    policies.push_back(baseline);
  }
  fmt::print(stderr, "[3/3] answering a {}-token passkey prompt under {} policies\n", prefix.size(),
             policies.size());
  const int max_new = static_cast<int>(tokenizer->encode(instance.answer, false).size()) + 2;
  const std::vector<PolicyOutcome> outcomes =
      run_policies(*model, prefix, suffix, policies, max_new, engine_options);

  fmt::print("EKVA demo: {} ({} layers, {} experts top-{}), calibrated on {} held-out tokens\n\n",
             model_dir.filename().string(), spec.num_layers, spec.num_experts, spec.top_k,
             stats.tokens);
  fmt::print("A {}-token context hides a passkey; the question at its end:\n  ...{}\n",
             prefix.size(), instance.question);
  fmt::print("expected answer:{}\n\n", instance.answer);
  fmt::print("{:<12} {:>7}  {:<24} {:<8} {:>12} {:>9}\n", "policy", "budget", "answer", "correct",
             "KV in use", "of full");
  for (size_t p = 0; p < policies.size(); ++p) {
    const PolicyOutcome& o = outcomes[p];
    std::string answer = tokenizer->decode(o.generated, true);
    for (char& c : answer) {
      if (c == '\n') c = ' ';
    }
    const bool correct = answer_matches(instance, answer);
    fmt::print(
        "{:<12} {:>7}  {:<24} {:<8} {:>12} {:>8.1f}%\n", policies[p].name,
        policies[p].name == "full" ? "1.0" : fmt::format("{:g}", policies[p].budget.value_or(1.0)),
        fmt::format("\"{}\"", answer), correct ? "yes" : "no", mib(static_cast<double>(o.kv_bytes)),
        100.0 * static_cast<double>(o.kv_bytes) / static_cast<double>(o.kv_bytes_full));
  }
  fmt::print(
      "\nKV bytes count the pages of the paged pool in use after the answer ({} K and V, {} "
      "backend).\n",
      dtype_name(engine_options.kv.dtype), device);
  fmt::print("wall time {:.1f} s (sweeps over budgets and tasks: ekva eval; docs/RESULTS.md)\n",
             elapsed());
  return 0;
}

}  // namespace

void add_demo(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "demo",
      "Calibrate, plan, and answer a long-context passkey question with full KV, EKVA and "
      "baselines on the embedded model");
  auto a = std::make_shared<DemoArgs>();
  cmd->add_option("--model", a->model_dir, "Model directory (default: the embedded model)")
      ->capture_default_str();
  cmd->add_option("--calibration", a->calibration, "Calibration text (disjoint from data/eval)")
      ->capture_default_str();
  cmd->add_option("--calibration-tokens", a->calibration_tokens, "Calibration tokens at most")
      ->capture_default_str()
      ->check(CLI::Range(512, 1 << 24));
  cmd->add_option("--context", a->context, "Tokens of the passkey sample (prompt and answer)")
      ->capture_default_str()
      ->check(CLI::Range(128, 1 << 24));
  cmd->add_option("--budget", a->budget, "KV budget of EKVA and the baselines")
      ->capture_default_str();
  cmd->add_option("--baselines", a->baselines, "Comma-separated baseline policies")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the instance")->capture_default_str();
  add_device_option(cmd, a->device);
  cmd->callback([&action, a] { action = [a] { return run_demo(*a); }; });
}

}  // namespace ekva::cli
