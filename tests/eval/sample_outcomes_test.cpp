// evaluate_tasks keeps every sample's outcome next to the aggregate, in a form the paired tests
// can use: the aggregate must follow from the per-sample values.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "eval/evaluate.h"
#include "eval/report.h"
#include "io/json_file.h"
#include "io/repository.h"
#include "model/model.h"
#include "support/repo_paths.h"
#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

// Passkey and ppl on short windows of the embedded model: full KV and the named policies at 10%.
TaskEvalOptions passkey_and_ppl(const std::vector<std::string>& policies, int samples) {
  TaskEvalOptions options;
  options.tasks = {{TaskKind::kPasskey}, {}};  // and ppl
  options.policies = {PolicyOptions{}};
  for (const std::string& name : policies) {
    PolicyOptions p;
    p.name = name;
    p.budget = 0.1;
    options.policies.push_back(p);
  }
  options.context_tokens = 256;
  options.samples = samples;
  options.ppl_tokens = 16;
  options.heldout_text =
      read_text_file((testing::kRepoRoot / "data/eval/heldout.txt").string()).substr(0, 8000);
  return options;
}

TEST(SampleOutcomes, TheScoreFollowsFromTheSamples) {
  const auto model = Model::load(testing::kEmbeddedModel);
  const auto tokenizer = load_tokenizer(testing::kEmbeddedModel);
  const TaskEvalOptions options = passkey_and_ppl({"streaming", "snapkv"}, 3);
  const std::vector<TaskScore> scores = evaluate_tasks(*model, *tokenizer, options);
  ASSERT_EQ(scores.size(), 6u);
  for (const TaskScore& s : scores) {
    ASSERT_EQ(s.sample_values.size(), 3u) << s.task << " " << s.policy;
    const double sum = std::accumulate(s.sample_values.begin(), s.sample_values.end(), 0.0);
    if (s.task == "passkey") {
      EXPECT_TRUE(s.sample_tokens.empty());
      for (double v : s.sample_values) EXPECT_TRUE(v == 0.0 || v == 1.0) << v;
      EXPECT_DOUBLE_EQ(s.score, sum / 3);
    } else {
      EXPECT_EQ(s.sample_tokens, std::vector<int>(3, 16));
      EXPECT_NEAR(s.score, std::exp(sum / 48), 1e-9 * s.score);
    }
  }
  // Full is never paired; of the two expert-blind policies the better is the other's baseline.
  const std::vector<PairedRow> rows = paired_comparisons(scores);
  ASSERT_EQ(rows.size(), 2u);
  for (const PairedRow& r : rows) {
    EXPECT_NE(r.policy, r.baseline);
    EXPECT_LE(r.test.first_better + r.test.second_better, 3);
  }
}

// Samples evaluated on several threads add up to exactly what one at a time gives: each sample's
// engines are its own, and the sums are taken in sample order afterwards.
TEST(SampleOutcomes, JobsDoNotChangeTheResults) {
  const auto model = Model::load(testing::kEmbeddedModel);
  const auto tokenizer = load_tokenizer(testing::kEmbeddedModel);
  TaskEvalOptions options = passkey_and_ppl({"snapkv", "ekva"}, 4);
  options.mode = QueryMode::kAgnostic;  // decode-time evictions too
  const std::vector<TaskScore> one = evaluate_tasks(*model, *tokenizer, options);
  options.jobs = 3;
  int calls = 0, last = 0;
  options.progress = [&](int done, int total) {
    ++calls;
    EXPECT_GT(done, last);
    EXPECT_EQ(total, 24);
    last = done;
  };
  const std::vector<TaskScore> three = evaluate_tasks(*model, *tokenizer, options);
  EXPECT_EQ(calls, 8);
  EXPECT_EQ(last, 24);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE(one[i].task + " " + one[i].policy);
    EXPECT_EQ(one[i].sample_values, three[i].sample_values);
    EXPECT_EQ(one[i].sample_tokens, three[i].sample_tokens);
    EXPECT_EQ(one[i].score, three[i].score);
    EXPECT_EQ(one[i].kv_fraction, three[i].kv_fraction);
    EXPECT_EQ(one[i].kv_bytes, three[i].kv_bytes);
  }
  options.jobs = 0;
  EXPECT_THROW(evaluate_tasks(*model, *tokenizer, options), Error);
}

}  // namespace
}  // namespace ekva
