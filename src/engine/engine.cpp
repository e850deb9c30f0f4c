#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace ekva {

Engine::Engine(const Model& model, const EngineOptions& options,
               std::optional<PolicyOptions> policy)
    : model_(&model),
      layout_(model.spec(), options.num_sequences, options.kv, options.kv_capacity_pages),
      backend_(std::make_unique<cpu::CpuBackend>(model, layout_)) {
  if (policy) set_policy(*policy);
}

Engine::Engine(const Engine& other)
    : model_(other.model_),
      layout_(other.layout_),
      backend_(other.backend_->clone()),
      policy_(other.policy_) {}

void Engine::set_policy(const PolicyOptions& options) {
  policy_.emplace(options, model_->spec());
}

std::vector<float> Engine::step(const ForwardBatch& batch, ForwardObserver* observer) {
  const StepPlan plan = plan_step(model_->spec(), batch, layout_);
  std::vector<float> logits = backend_->run(plan, layout_, observer);
  const auto bad =
      std::find_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad != logits.end()) {
    const int vocab = model_->spec().vocab_size;
    const size_t row = static_cast<size_t>(bad - logits.begin()) / vocab;
    fail(ErrorKind::kInvalidFile,
         "{}: the model's logits are not finite (token {} of the step, vocabulary entry {}); its "
         "weights hold NaN or Inf values or overflow",
         model_->dir().string(), plan.logit_rows[row], (bad - logits.begin()) % vocab);
  }
  return logits;
}

std::vector<float> Engine::prefill(int seq, std::span<const int32_t> tokens, bool all_logits,
                                   ForwardObserver* observer) {
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "prefill: no tokens");
  ForwardBatch batch;
  const int32_t start = layout_.next_position(seq);
  for (size_t i = 0; i < tokens.size(); ++i)
    batch.add(tokens[i], seq, start + static_cast<int32_t>(i));
  if (!all_logits) batch.logit_rows = {batch.size() - 1};
  if (policy_) batch.score_query = policy_->prefill_score_queries(batch.size());
  return step(batch, observer);
}

void Engine::compress(int seq, int prompt_len) {
  if (policy_) backend_->apply(policy_->compress(layout_, seq, prompt_len), layout_);
}

std::vector<float> Engine::decode(int seq, int32_t token) {
  ForwardBatch batch;
  batch.add(token, seq, layout_.next_position(seq));
  if (policy_) batch.score_query = {static_cast<uint8_t>(policy_->scores_decode())};
  std::vector<float> logits = step(batch);
  if (policy_) backend_->apply(policy_->evict(layout_, seq), layout_);
  return logits;
}

}  // namespace ekva
