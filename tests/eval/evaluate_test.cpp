// Task evaluation on the embedded default model, and the `ekva tasks` command.
#include "eval/evaluate.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/generate.h"
#include "engine/loss.h"
#include "io/json_file.h"
#include "io/repository.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

const std::string kModelDir = std::string(EKVA_FIXTURES) + "/../../models/ekva-moe-8m";

TEST(Evaluate, DefaultModelFindsThePasskeyWithTheFullCache) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskEvalOptions options;
  options.tasks = {{TaskKind::kPasskey}};
  options.policies = {PolicyOptions{}};
  options.context_tokens = 512;
  options.samples = 3;
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].policy, "full");
  EXPECT_EQ(scores[0].samples, 3);
  EXPECT_DOUBLE_EQ(scores[0].score, 1.0);
  EXPECT_DOUBLE_EQ(scores[0].kv_fraction, 1.0);
  EXPECT_EQ(scores[0].task, "passkey");
  EXPECT_GT(scores[0].interval.low, 0.0);  // Wilson: 3 of 3 is not proof of 1.0
  EXPECT_DOUBLE_EQ(scores[0].interval.high, 1.0);
}

PolicyOptions policy(const std::string& name, double budget) {
  PolicyOptions p;
  p.name = name;
  p.budget = budget;
  return p;
}

// Sharing one prefill between policies (each compressing its own copy of the cache) must give what
// each policy gives on its own cache, token for token and byte for byte.
TEST(RunPolicies, SharedPrefillMatchesGeneratePerPolicy) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskOptions task_options;
  task_options.prompt_tokens = 200;
  const TaskInstance instance =
      generate_task(TaskKind::kPasskey, 11, task_options,
                    [&](const std::string& text) { return tokenizer->encode(text, false).size(); });
  const auto [prefix, suffix] =
      instance_tokens(instance, *tokenizer, *model->spec().bos_id, QueryMode::kAware);
  EXPECT_TRUE(suffix.empty());
  // keydiff shares the unscored prefill of full and streaming, and rescores its own copy.
  const std::vector<PolicyOptions> policies = {policy("full", 1.0),      policy("snapkv", 0.3),
                                               policy("h2o", 0.3),       policy("ekva", 0.3),
                                               policy("streaming", 0.3), policy("keydiff", 0.3)};
  const std::vector<PolicyOutcome> shared = run_policies(*model, prefix, {}, policies, 6);
  ASSERT_EQ(shared.size(), policies.size());
  for (size_t p = 0; p < policies.size(); ++p) {
    Engine alone(*model, {}, policies[p]);
    GenerateOptions g;
    g.max_new_tokens = 6;
    const GenerateResult r = generate(alone, prefix, g);
    EXPECT_EQ(shared[p].generated, r.tokens) << policies[p].name;
    EXPECT_EQ(shared[p].kv_bytes, r.kv_bytes) << policies[p].name;
    EXPECT_EQ(shared[p].kv_bytes_full, r.kv_bytes_full) << policies[p].name;
  }
  EXPECT_LT(shared[1].kv_bytes, shared[0].kv_bytes);
}

// With the full cache, scoring a continuation token by token in decode mode gives the loss one
// prefill over the whole window gives.
TEST(RunPolicies, DecodeModeLossOfTheFullCacheEqualsThePrefillLoss) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  const std::vector<int32_t> text = tokenizer->encode(
      read_text_file(std::string(EKVA_FIXTURES) + "/../../data/eval/heldout.txt"), false);
  std::vector<int32_t> window{*model->spec().bos_id};
  window.insert(window.end(), text.begin(), text.begin() + 160);
  const std::vector<int32_t> prefix(window.begin(), window.end() - 40);
  const std::vector<int32_t> suffix(window.end() - 40, window.end());
  const PolicyOutcome full = run_policies(*model, prefix, suffix, {PolicyOptions{}}, 0)[0];
  EXPECT_EQ(full.scored_tokens, 40);
  EXPECT_TRUE(full.generated.empty());

  ForwardBatch batch;
  for (size_t i = 0; i < window.size(); ++i) batch.add(window[i], 0, static_cast<int32_t>(i));
  batch.logit_rows.clear();
  const std::vector<float> logits = Engine(*model).step(batch);
  const int vocab = model->spec().vocab_size;
  const size_t first = prefix.size() - 1;  // the row that predicts suffix[0]
  const std::vector<float> rows(logits.begin() + static_cast<ptrdiff_t>(first * vocab),
                                logits.end());
  const std::vector<int32_t> targets(window.begin() + static_cast<ptrdiff_t>(first), window.end());
  const double expected = next_token_loss(rows, targets, vocab);
  EXPECT_NEAR(full.nll_sum / full.scored_tokens, expected, 1e-3 * expected);

  // Evicting most of the prefix costs loss.
  const PolicyOutcome small =
      run_policies(*model, prefix, suffix, {policy("streaming", 0.1)}, 0)[0];
  EXPECT_GT(small.nll_sum, full.nll_sum);
}

TEST(Evaluate, PerplexityAndQueryAgnosticMode) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskEvalOptions options;
  options.tasks = {parse_eval_task("ppl"), parse_eval_task("passkey")};
  options.policies = {PolicyOptions{}, policy("snapkv", 0.5)};
  options.context_tokens = 256;
  options.samples = 2;
  options.mode = QueryMode::kAgnostic;
  options.ppl_tokens = 32;
  // Two 255-token windows need a few kilobytes; tokenizing all of it would only cost time.
  options.heldout_text =
      read_text_file(std::string(EKVA_FIXTURES) + "/../../data/eval/heldout.txt").substr(0, 8000);
  int last_done = 0, last_total = 0;
  options.progress = [&](int done, int total) {
    EXPECT_GT(done, last_done);
    last_done = done;
    last_total = total;
  };
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  EXPECT_EQ(last_done, 8);
  EXPECT_EQ(last_total, 8);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_EQ(scores[0].task, "ppl");
  EXPECT_GT(scores[0].score, 1.0);
  EXPECT_LT(scores[0].score, 4096.0);  // better than uniform over the vocabulary
  EXPECT_NEAR(scores[0].quality, 1.0 / scores[0].score, 1e-12);
  EXPECT_LE(scores[0].interval.low, scores[0].score);
  EXPECT_GE(scores[0].interval.high, scores[0].score);
  EXPECT_LT(scores[1].kv_fraction, 0.7);
  EXPECT_EQ(scores[2].task, "passkey");
  EXPECT_EQ(parse_eval_task("passkey").name(), "passkey");
  EXPECT_THROW(parse_eval_task("pp"), Error);
  EXPECT_THROW(parse_query_mode("both"), Error);
  options.heldout_text = "too short";
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
}

TEST(Evaluate, RefusesAContextBeyondTheModelAndNoSamples) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskEvalOptions options;
  options.tasks = {{TaskKind::kPasskey}};
  options.policies = {PolicyOptions{}};
  options.context_tokens = 8192;
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
  options.context_tokens = 512;
  options.samples = 0;
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
}

TEST(EvalCommand, HidesTheFactsInAFillerTextAndRefusesOneWithoutParagraphs) {
  const testing::TempDir dir;
  const auto filler = dir.path() / "filler.txt", empty = dir.path() / "empty.txt",
             out = dir.path() / "out.json";
  std::ofstream(filler) << "The river bends twice before the mill.\n\nRain kept the road empty.\n";
  std::ofstream(empty) << "\n\n  \n";
  const std::string eval = std::string(EKVA_BINARY) + " eval --model " + kModelDir +
                           " --policies full --tasks passkey --context 256 --samples 1 --json";
  ASSERT_EQ(
      std::system(
          (eval + " --filler " + filler.string() + " > " + out.string() + " 2>/dev/null").c_str()),
      0);
  std::ifstream in(out);
  EXPECT_EQ(nlohmann::json::parse(in)["filler"], filler.string());
  const int status =
      std::system((eval + " --filler " + empty.string() + " > " + out.string() + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string message = read_text_file(out);
  EXPECT_NE(message.find(empty.string() + ": the filler text holds no paragraph"),
            std::string::npos)
      << message;
}

TEST(TasksCommand, WritesTheRequestedInstancesAsJsonLines) {
  const auto out = std::filesystem::temp_directory_path() / "ekva_tasks_test.jsonl";
  const std::string cmd = std::string(EKVA_BINARY) +
                          " tasks --task kv-retrieval --context 300 --count 3 --seed 5 --out " +
                          out.string() + " --tokenizer " + kModelDir + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(out);
  const auto tokenizer = load_tokenizer(kModelDir);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["task"], "kv-retrieval");
    const std::string prompt = j["context"].get<std::string>() + j["question"].get<std::string>();
    EXPECT_EQ(tokenizer->encode(prompt, false).size(), j["prompt_tokens"].get<size_t>());
    EXPECT_LE(j["prompt_tokens"].get<size_t>(), 300u);
  }
  EXPECT_EQ(lines, 3);
  std::filesystem::remove(out);
}

TEST(EvalCommand, WritesResultsChartsAndTheIsoQualityTable) {
  const auto out = std::filesystem::temp_directory_path() / "ekva_eval_cli_test";
  std::filesystem::remove_all(out);
  const std::string json_file = (out / "stdout.json").string();
  std::filesystem::create_directories(out);
  const std::string cmd = std::string(EKVA_BINARY) + " eval --model " + kModelDir +
                          " --policies full,ekva-nogroup,streaming --budgets 0.3,0.6 --tasks "
                          "passkey,ppl --context 256 --samples 1 --ppl-tokens 16 --out " +
                          out.string() + " --json > " + json_file + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(json_file);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["results"].size(), 2u * (1 + 2 * 2));  // full once, two policies at two budgets
  for (const auto& r : j["results"]) {
    EXPECT_TRUE(r.contains("task") && r.contains("policy") && r.contains("budget") &&
                r.contains("score") && r.contains("ci95") && r.contains("kv_bytes"));
  }
  EXPECT_EQ(j["iso_quality"].size(), 2u * 2 * 2);  // tasks x non-full policies x shares
  EXPECT_GT(j["wall_seconds"].get<double>(), 0.0);
  for (const char* file : {"results.json", "results.csv", "chart-passkey.svg", "chart-ppl.svg"})
    EXPECT_TRUE(std::filesystem::exists(out / file)) << file;
  std::filesystem::remove_all(out);
}

TEST(DemoCommand, AnswersWithTheFullCacheAndPrintsTheTable) {
  const std::string cmd =
      std::string(EKVA_BINARY) + " demo --context 256 --calibration-tokens 512 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
  ASSERT_EQ(pclose(pipe), 0) << output;
  EXPECT_NE(output.find("expected answer:"), std::string::npos);
  std::istringstream lines(output);
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("full ", 0) == 0) {
      EXPECT_NE(line.find(" yes "), std::string::npos) << line;
    }
    for (const char* p : {"full ", "ekva ", "snapkv ", "streaming "}) rows += line.rfind(p, 0) == 0;
  }
  EXPECT_EQ(rows, 4);
}

}  // namespace
}  // namespace ekva
