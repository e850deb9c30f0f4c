#pragma once
// Quality of a model under KV-cache policies: the same seeded task instances (greedy answers,
// exact-answer scoring) and the same held-out windows (perplexity of a continuation) for every
// policy and budget. Each sample is prefilled once per distinct set of scoring queries; every
// policy then compresses its own copy of that cache.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "eval/metrics.h"
#include "eval/tasks.h"
#include "kv/policy.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace ekva {

// Query-aware: the cache is compressed after context and question (the question's queries vote).
// Query-agnostic: it is compressed after the context alone; the question then streams in token by
// token with eviction active, as when one compressed context serves questions not yet known.
enum class QueryMode { kAware, kAgnostic };
std::string_view query_mode_name(QueryMode mode);
QueryMode parse_query_mode(std::string_view name);

// A generated long-context task, or (no kind) "ppl": the perplexity of a held-out continuation
// after a compressed prefix, scored in decode mode with eviction active.
struct EvalTask {
  std::optional<TaskKind> kind;
  std::string_view name() const { return kind ? task_name(*kind) : "ppl"; }
  bool higher_is_better() const { return kind.has_value(); }
};
EvalTask parse_eval_task(std::string_view name);  // a task name of tasks.h, or "ppl"

// (steps done, steps in all); a step is one sample under one policy.
using EvalProgress = std::function<void(int, int)>;

struct TaskEvalOptions {
  std::vector<EvalTask> tasks;
  std::vector<PolicyOptions> policies;
  // The window each sample fits in: BOS, prompt and the generated answer (tasks), or BOS, prefix
  // and the scored continuation (ppl).
  size_t context_tokens = 4096;
  int samples = 20;
  uint64_t seed = 777001;
  QueryMode mode = QueryMode::kAware;
  // Paragraphs of prose the tasks hide their facts in (TaskOptions::filler); empty: noise
  // sentences.
  std::vector<std::string> filler;
  std::string heldout_text;  // ppl: windows are cut from it, one after another
  int ppl_tokens = 128;      // ppl: continuation tokens scored per window
  EngineOptions engine;      // KV pages (their element type is what byte counts count) and backend
  // Samples evaluated at once, on threads, each with engines of its own: on the GPU their streams
  // overlap, where one sample at a time leaves it idle between small kernels. The results do not
  // depend on it. The backend factory must take calls from several threads.
  int jobs = 1;
  EvalProgress progress;  // called from one thread at a time
};

// Tokens held back from the context for the answer; the prompt gets the rest.
inline constexpr size_t kAnswerRoom = 32;

struct TaskScore {
  std::string task;
  std::string policy;
  double budget;
  // Share of samples answered exactly, in [0, 1]; for ppl the perplexity (lower is better).
  double score;
  Interval interval;  // 95%: Wilson for accuracies, normal on the mean NLL for ppl
  // Higher-is-better quality: the score, or 1 / perplexity.
  double quality;
  int samples;
  double kv_bytes;       // K/V bytes in use at the end, mean over samples
  double kv_bytes_full;  // what a full cache holds for the same tokens, mean over samples
  double kv_fraction;    // kv_bytes / kv_bytes_full, mean over samples
  // Per sample in instance (window) order, so that policies can be compared pairwise: 1 or 0,
  // answered or not (tasks); the summed NLL of the window's scored tokens (ppl), whose count is in
  // sample_tokens (empty for tasks).
  std::vector<double> sample_values = {};
  std::vector<int> sample_tokens = {};
};

// One score per (task, policy), in the order of options.tasks then options.policies.
std::vector<TaskScore> evaluate_tasks(const Model& model, const Tokenizer& tokenizer,
                                      const TaskEvalOptions& options);

// One sample under one policy.
struct PolicyOutcome {
  std::vector<int32_t> generated;  // greedy answer tokens (tasks); empty for ppl
  double nll_sum = 0.0;            // summed NLL of the scored tokens (ppl)
  int scored_tokens = 0;
  size_t kv_bytes = 0;
  size_t kv_bytes_full = 0;
};

// Runs `prefix` then `suffix` under each policy: the prefix is prefilled (once per distinct set of
// scoring queries) and compressed; suffix tokens then stream one at a time with eviction, each
// scored (NLL) against the logits before it; then up to max_new_tokens greedy tokens are generated
// (stopping at EOS). Outcomes come in the order of `policies`.
std::vector<PolicyOutcome> run_policies(const Model& model, const std::vector<int32_t>& prefix,
                                        const std::vector<int32_t>& suffix,
                                        const std::vector<PolicyOptions>& policies,
                                        int max_new_tokens,
                                        const EngineOptions& engine_options = {});

// The prefix and suffix a task instance is run as: BOS + prompt and nothing (query-aware), or
// BOS + context and the question (query-agnostic).
std::pair<std::vector<int32_t>, std::vector<int32_t>> instance_tokens(const TaskInstance& instance,
                                                                      const Tokenizer& tokenizer,
                                                                      int32_t bos, QueryMode mode);

}  // namespace ekva
