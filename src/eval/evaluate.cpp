#include "eval/evaluate.h"

#include "core/error.h"
#include "model/generate.h"

namespace ekva {

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
  if (options.samples < 1) {
    fail(ErrorKind::kInvalidArgument, "eval: samples must be at least 1, not {}", options.samples);
  }
  if (!spec.bos_id) fail(ErrorKind::kInvalidFile, "eval: the model config names no bos_token_id");
  const TokenCounter count = [&](const std::string& text) {
    return tokenizer.encode(text, false).size();
  };
  TaskOptions task_options;
  task_options.prompt_tokens = options.context_tokens - kAnswerRoom - 1;

  std::vector<TaskScore> scores;
  for (TaskKind kind : options.tasks) {
    std::vector<TaskInstance> instances;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < options.samples; ++i) {
      instances.push_back(generate_task(kind, instance_seed(options.seed, i), task_options, count));
      std::vector<int32_t> ids{*spec.bos_id};
      const std::vector<int32_t> text = tokenizer.encode(instances.back().prompt(), false);
      ids.insert(ids.end(), text.begin(), text.end());
      prompts.push_back(std::move(ids));
    }
    for (const PolicyOptions& policy_options : options.policies) {
      int correct = 0;
      double kv_fraction = 0;
      for (int i = 0; i < options.samples; ++i) {
        KvPolicy policy(policy_options, spec);
        KvCache cache(spec, 1);
        GenerateOptions generate_options;
        generate_options.max_new_tokens =
            static_cast<int>(tokenizer.encode(instances[i].answer, false).size()) + 2;
        const GenerateResult r = generate(model, cache, prompts[i], generate_options, &policy);
        correct += answer_matches(instances[i], tokenizer.decode(r.tokens, true)) ? 1 : 0;
        kv_fraction += r.kv_bytes_full > 0 ? static_cast<double>(r.kv_bytes) / r.kv_bytes_full : 1;
      }
      scores.push_back({kind, policy_options.name, policy_options.budget,
                        static_cast<double>(correct) / options.samples, options.samples,
                        kv_fraction / options.samples});
    }
  }
  return scores;
}

}  // namespace ekva
