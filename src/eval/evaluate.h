#pragma once
// Task accuracy of a model under KV-cache policies: the same seeded instances for every policy,
// greedy answers, exact-answer scoring (answer_matches).
#include <cstdint>
#include <string>
#include <vector>

#include "eval/tasks.h"
#include "kv/policy.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ekva {

struct TaskEvalOptions {
  std::vector<TaskKind> tasks;
  std::vector<PolicyOptions> policies;
  // The window each sample fits in: BOS, prompt and the generated answer.
  size_t context_tokens = 4096;
  int samples = 20;
  uint64_t seed = 777001;
};

// Tokens held back from the context for the answer; the prompt gets the rest.
inline constexpr size_t kAnswerRoom = 32;

struct TaskScore {
  TaskKind task;
  std::string policy;
  double budget;
  double score;  // share of samples answered exactly, in [0, 1]
  int samples;
  double kv_fraction;  // KV bytes kept at the end over what a full cache holds, mean over samples
};

// One score per (task, policy), in the order of options.tasks then options.policies.
std::vector<TaskScore> evaluate_tasks(const Model& model, const Tokenizer& tokenizer,
                                      const TaskEvalOptions& options);

}  // namespace ekva
