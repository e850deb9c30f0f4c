#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "eval/tasks.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

struct TasksArgs {
  std::string task;
  size_t context = 4096;
  size_t count = 1;
  uint64_t seed = 0;
  std::string out;
  std::string tokenizer;
  std::string filler;
};

int run_tasks(const TasksArgs& a) {
  check_output_file(a.out);
  const TaskKind kind = parse_task_name(a.task);
  const auto tokenizer = load_tokenizer(a.tokenizer);
  const TokenCounter count = [&](const std::string& text) {
    return tokenizer->encode(text, false).size();
  };
  const std::vector<std::string> filler =
      a.filler.empty() ? std::vector<std::string>{} : read_filler(a.filler);
  TaskOptions options;
  options.prompt_tokens = a.context;
  if (!filler.empty()) options.filler = &filler;
  std::string lines;
  for (size_t i = 0; i < a.count; ++i) {
    const TaskInstance t = generate_task(kind, instance_seed(a.seed, i), options, count);
    lines += nlohmann::json{{"task", task_name(t.kind)},        {"seed", t.seed},
                            {"prompt_tokens", t.prompt_tokens}, {"context", t.context},
                            {"question", t.question},           {"answer", t.answer}}
                 .dump() +
             "\n";
  }
  write_text_file(a.out, lines);
  fmt::print(stderr, "wrote {} {} instances of at most {} prompt tokens to {}\n", a.count, a.task,
             a.context, a.out);
  return 0;
}

}  // namespace

void add_tasks(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "tasks", "Generate long-context task instances (context, question, answer) as JSON lines");
  auto a = std::make_shared<TasksArgs>();
  cmd->add_option("--task", a->task, "passkey, multikey-needle, kv-retrieval or variable-tracking")
      ->required();
  // Fitting a prompt re-encodes it a few times, so time and memory grow with its length; 2^20
  // tokens (about 4 MB of text) bounds them.
  cmd->add_option("--context", a->context, "Prompt length in tokens (context + question)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--count", a->count, "Number of instances")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--seed", a->seed, "Seed of the set; instance i uses a seed derived from it");
  cmd->add_option("--out", a->out, "Output file (JSON lines)")->required();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "Tokenizer that counts the tokens: a model directory or a tokenizer file")
      ->required();
  cmd->add_option(
      "--filler", a->filler,
      "Text file whose paragraphs hide the facts (default: repetitive noise sentences)");
  cmd->callback([&action, a] { action = [a] { return run_tasks(*a); }; });
}

}  // namespace ekva::cli
