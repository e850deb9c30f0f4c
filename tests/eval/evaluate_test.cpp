// Task evaluation on the embedded default model, and the `ekva tasks` command.
#include "eval/evaluate.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ekva {
namespace {

const std::string kModelDir = std::string(EKVA_FIXTURES) + "/../../models/ekva-moe-8m";

TEST(Evaluate, DefaultModelFindsThePasskeyWithTheFullCache) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskEvalOptions options;
  options.tasks = {TaskKind::kPasskey};
  options.policies = {PolicyOptions{}};
  options.context_tokens = 512;
  options.samples = 3;
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  ASSERT_EQ(scores.size(), 1u);
  EXPECT_EQ(scores[0].policy, "full");
  EXPECT_EQ(scores[0].samples, 3);
  EXPECT_DOUBLE_EQ(scores[0].score, 1.0);
  EXPECT_DOUBLE_EQ(scores[0].kv_fraction, 1.0);
}

TEST(Evaluate, RefusesAContextBeyondTheModelAndNoSamples) {
  const auto model = Model::load(kModelDir);
  const auto tokenizer = load_tokenizer(kModelDir);
  TaskEvalOptions options;
  options.tasks = {TaskKind::kPasskey};
  options.policies = {PolicyOptions{}};
  options.context_tokens = 8192;
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
  options.context_tokens = 512;
  options.samples = 0;
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
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

}  // namespace
}  // namespace ekva
