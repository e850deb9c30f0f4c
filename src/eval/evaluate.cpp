#include "eval/evaluate.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/loss.h"

namespace ekva {
namespace {

int32_t greedy(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double nll_of(const std::vector<float>& logits, int32_t target, int vocab) {
  return next_token_loss(logits, {0, target}, vocab);  // one row predicting one token
}

struct Prefilled {
  std::vector<uint8_t> score_queries;
  Engine engine;
  std::vector<float> logits;  // of the prefix's last token
};

}  // namespace

std::string_view query_mode_name(QueryMode mode) {
  return mode == QueryMode::kAware ? "aware" : "agnostic";
}

QueryMode parse_query_mode(std::string_view name) {
  if (name == "aware") return QueryMode::kAware;
  if (name == "agnostic") return QueryMode::kAgnostic;
  fail(ErrorKind::kInvalidArgument, "unknown query mode '{}' (known: aware, agnostic)", name);
}

EvalTask parse_eval_task(std::string_view name) {
  if (name == "ppl") return {};
  return {parse_task_name(name)};
}

std::vector<PolicyOutcome> run_policies(const Model& model, const std::vector<int32_t>& prefix,
                                        const std::vector<int32_t>& suffix,
                                        const std::vector<PolicyOptions>& policies,
                                        int max_new_tokens, const EngineOptions& engine_options) {
  const ModelSpec& spec = model.spec();
  if (prefix.empty()) fail(ErrorKind::kInvalidArgument, "eval: the prefix is empty");
  const int64_t total = static_cast<int64_t>(prefix.size() + suffix.size()) + max_new_tokens;
  if (total > spec.max_position) {
    fail(ErrorKind::kInvalidArgument,
         "eval: {} prefix, {} suffix and {} new tokens exceed the model's {} positions",
         prefix.size(), suffix.size(), max_new_tokens, spec.max_position);
  }
  const int prefix_len = static_cast<int>(prefix.size());
  std::vector<Prefilled> prefills;  // a handful at most: none, the window, every query
  std::vector<PolicyOutcome> outcomes;
  for (const PolicyOptions& options : policies) {
    const KvPolicy policy(options, spec);
    const std::vector<uint8_t> score_queries = policy.prefill_score_queries(prefix_len);
    auto it = std::find_if(prefills.begin(), prefills.end(),
                           [&](const Prefilled& p) { return p.score_queries == score_queries; });
    if (it == prefills.end()) {
      Engine engine(model, engine_options, options);
      std::vector<float> logits = engine.prefill(0, prefix);
      prefills.push_back({score_queries, std::move(engine), std::move(logits)});
      it = prefills.end() - 1;
    }
    Engine engine = it->engine;
    engine.set_policy(options);
    std::vector<float> logits = it->logits;
    engine.compress(0, prefix_len);
    PolicyOutcome out;
    for (int32_t token : suffix) {
      out.nll_sum += nll_of(logits, token, spec.vocab_size);
      ++out.scored_tokens;
      logits = engine.decode(0, token);
    }
    for (int i = 0; i < max_new_tokens; ++i) {
      const int32_t next = greedy(logits);
      out.generated.push_back(next);
      if (std::find(spec.eos_ids.begin(), spec.eos_ids.end(), next) != spec.eos_ids.end()) break;
      if (i + 1 < max_new_tokens) logits = engine.decode(0, next);
    }
    out.kv_bytes = engine.layout().kv_bytes_in_use();
    out.kv_bytes_full = engine.layout().full_bytes(engine.layout().next_position(0));
    outcomes.push_back(std::move(out));
  }
  return outcomes;
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> instance_tokens(const TaskInstance& instance,
                                                                      const Tokenizer& tokenizer,
                                                                      int32_t bos, QueryMode mode) {
  std::vector<int32_t> prefix{bos};
  const std::vector<int32_t> body =
      tokenizer.encode(mode == QueryMode::kAware ? instance.prompt() : instance.context, false);
  prefix.insert(prefix.end(), body.begin(), body.end());
  std::vector<int32_t> suffix;
  if (mode == QueryMode::kAgnostic) suffix = tokenizer.encode(instance.question, false);
  return {std::move(prefix), std::move(suffix)};
}

std::vector<TaskScore> evaluate_tasks(const Model& model, const Tokenizer& tokenizer,
                                      const TaskEvalOptions& options) {
  const ModelSpec& spec = model.spec();
  if (options.context_tokens <= kAnswerRoom + 1) {
    fail(ErrorKind::kInvalidArgument, "eval: a context of {} tokens leaves no room for a prompt",
         options.context_tokens);
  }
  if (options.context_tokens > static_cast<size_t>(spec.max_position)) {
    fail(ErrorKind::kInvalidArgument, "eval: context {} exceeds the model's {} positions",
         options.context_tokens, spec.max_position);
  }
  if (options.jobs < 1) {
    fail(ErrorKind::kInvalidArgument, "eval: jobs must be at least 1, not {}", options.jobs);
  }
  if (options.samples < 1) {
    fail(ErrorKind::kInvalidArgument, "eval: samples must be at least 1, not {}", options.samples);
  }
  if (!spec.bos_id) fail(ErrorKind::kInvalidFile, "eval: the model config names no bos_token_id");
  const int32_t bos = *spec.bos_id;
  const TokenCounter count = [&](const std::string& text) {
    return tokenizer.encode(text, false).size();
  };
  TaskOptions task_options;
  task_options.prompt_tokens = options.context_tokens - kAnswerRoom - 1;
  if (!options.filler.empty()) task_options.filler = &options.filler;

  std::vector<int32_t> heldout;
  const size_t window = options.context_tokens - 1;  // BOS comes first
  for (const EvalTask& task : options.tasks) {
    if (task.kind || !heldout.empty()) continue;
    if (options.ppl_tokens < 1 || static_cast<size_t>(options.ppl_tokens) >= window) {
      fail(ErrorKind::kInvalidArgument, "eval: ppl scores {} tokens of a {}-token window",
           options.ppl_tokens, window);
    }
    heldout = tokenizer.encode(options.heldout_text, false);
    if (heldout.size() < window * options.samples) {
      fail(ErrorKind::kInvalidArgument,
           "eval: ppl needs {} windows of {} tokens, the held-out text has {} tokens",
           options.samples, window, heldout.size());
    }
  }

  const int steps =
      static_cast<int>(options.tasks.size() * options.policies.size()) * options.samples;
  int done = 0;
  std::vector<TaskScore> scores;
  for (const EvalTask& task : options.tasks) {
    const size_t first = scores.size();
    for (const PolicyOptions& p : options.policies) {
      scores.push_back({std::string(task.name()),
                        p.name,
                        p.budget.value_or(1.0),
                        0,
                        {},
                        0,
                        options.samples,
                        0,
                        0,
                        0});
    }
    // The instances are made and tokenized here, one after another; the samples then run
    // options.jobs at a time and are added up in order, so the sums do not depend on the jobs.
    const int n = options.samples;
    std::vector<std::vector<int32_t>> prefixes(n), suffixes(n);
    std::vector<std::optional<TaskInstance>> instances(n);
    std::vector<int> max_new(n, 0);
    for (int i = 0; i < n; ++i) {
      if (task.kind) {
        instances[i] =
            generate_task(*task.kind, instance_seed(options.seed, i), task_options, count);
        std::tie(prefixes[i], suffixes[i]) =
            instance_tokens(*instances[i], tokenizer, bos, options.mode);
        max_new[i] = static_cast<int>(tokenizer.encode(instances[i]->answer, false).size()) + 2;
      } else {
        const auto begin = heldout.begin() + static_cast<ptrdiff_t>(i * window);
        const auto split = begin + static_cast<ptrdiff_t>(window - options.ppl_tokens);
        prefixes[i].push_back(bos);
        prefixes[i].insert(prefixes[i].end(), begin, split);
        suffixes[i].assign(split, begin + static_cast<ptrdiff_t>(window));
      }
    }
    std::vector<std::vector<PolicyOutcome>> outcomes(n);
    std::vector<std::exception_ptr> failures(n);  // an exception must not leave the parallel region
    std::atomic<bool> failed{false};
    // One job: no parallel region is active, so the backend's own threads stay available.
#pragma omp parallel for schedule(dynamic, 1) num_threads(options.jobs) if (options.jobs > 1)
    for (int i = 0; i < n; ++i) {
      if (failed.load()) continue;  // a sample failed: the rest are not worth running
      try {
        outcomes[i] = run_policies(model, prefixes[i], suffixes[i], options.policies, max_new[i],
                                   options.engine);
      } catch (...) {
        failures[i] = std::current_exception();
        failed.store(true);
      }
#pragma omp critical(ekva_eval_progress)
      {
        done += static_cast<int>(options.policies.size());
        if (options.progress) options.progress(done, steps);
      }
    }
    for (const std::exception_ptr& failure : failures) {
      if (failure) std::rethrow_exception(failure);  // the earliest failed sample's
    }
    std::vector<std::vector<int>> correct(options.policies.size());
    std::vector<std::vector<double>> nll(options.policies.size());
    std::vector<std::vector<int>> scored(options.policies.size());
    for (int i = 0; i < n; ++i) {
      for (size_t p = 0; p < outcomes[i].size(); ++p) {
        const PolicyOutcome& o = outcomes[i][p];
        TaskScore& s = scores[first + p];
        if (instances[i]) {
          correct[p].push_back(answer_matches(*instances[i], tokenizer.decode(o.generated, true)));
        } else {
          nll[p].push_back(o.nll_sum);
          scored[p].push_back(o.scored_tokens);
        }
        s.kv_bytes += static_cast<double>(o.kv_bytes) / options.samples;
        s.kv_bytes_full += static_cast<double>(o.kv_bytes_full) / options.samples;
        s.kv_fraction +=
            (o.kv_bytes_full > 0 ? static_cast<double>(o.kv_bytes) / o.kv_bytes_full : 1.0) /
            options.samples;
      }
    }
    for (size_t p = 0; p < options.policies.size(); ++p) {
      TaskScore& s = scores[first + p];
      if (task.kind) {
        const int hits = static_cast<int>(std::count(correct[p].begin(), correct[p].end(), 1));
        s.score = s.quality = static_cast<double>(hits) / options.samples;
        s.interval = wilson_interval(hits, options.samples);
        s.sample_values.assign(correct[p].begin(), correct[p].end());
      } else {
        s.sample_values = nll[p];
        s.sample_tokens = scored[p];
        const PerplexityEstimate e = perplexity_of(nll[p], scored[p]);
        s.score = e.perplexity;
        s.quality = 1.0 / e.perplexity;
        s.interval = e.interval;
      }
    }
  }
  return scores;
}

}  // namespace ekva
