// evaluate_tasks keeps every sample's outcome next to the aggregate, in a form the paired tests
// can use: the aggregate must follow from the per-sample values.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "eval/evaluate.h"
#include "eval/report.h"
#include "io/json_file.h"
#include "io/repository.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

TEST(SampleOutcomes, TheScoreFollowsFromTheSamples) {
  const std::string dir = std::string(EKVA_FIXTURES) + "/../../models/ekva-moe-8m";
  const auto model = Model::load(dir);
  const auto tokenizer = load_tokenizer(dir);
  TaskEvalOptions options;
  options.tasks = {{TaskKind::kPasskey}, {}};  // and ppl
  PolicyOptions streaming, snapkv;
  streaming.name = "streaming";
  snapkv.name = "snapkv";
  streaming.budget = snapkv.budget = 0.1;
  options.policies = {PolicyOptions{}, streaming, snapkv};
  options.context_tokens = 256;
  options.samples = 3;
  options.ppl_tokens = 16;
  options.heldout_text =
      read_text_file(std::string(EKVA_FIXTURES) + "/../../data/eval/heldout.txt").substr(0, 8000);
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

}  // namespace
}  // namespace ekva
