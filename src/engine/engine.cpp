#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace ekva {
namespace {

// Keeps each MoE layer's routing of a prompt (in PromptRouting's layout) and passes everything on
// to the caller's observer.
class PromptRecorder : public ForwardObserver {
 public:
  PromptRecorder(PromptRouting& prompt, const ModelSpec& spec, ForwardObserver* next)
      : prompt_(prompt), spec_(spec), next_(next) {}

  void on_router_logits(int layer, int moe_index, const float* logits, int n, int e) override {
    if (next_ != nullptr) next_->on_router_logits(layer, moe_index, logits, n, e);
  }
  void on_expert_output(int layer, int expert, const std::vector<int32_t>& rows,
                        const std::vector<float>& gates, const float* output, int hidden) override {
    if (next_ != nullptr) next_->on_expert_output(layer, expert, rows, gates, output, hidden);
  }
  void on_layer_routed(int layer, const ForwardBatch& batch, const KvLayout& layout,
                       const KvPages* pages, const float* q, const int32_t* experts,
                       const float* gates, int top_k) override {
    int moe_index = 0;
    for (int l = 0; l < layer; ++l) moe_index += spec_.layer_is_moe[l] ? 1 : 0;
    if (static_cast<int>(prompt_.layers.size()) <= moe_index) {
      prompt_.layers.resize(moe_index + 1);
    }
    LayerRouting& r = prompt_.layers[moe_index];
    r.top_k = top_k;
    const size_t n = static_cast<size_t>(batch.size()) * top_k;
    r.experts.insert(r.experts.end(), experts, experts + n);
    r.gates.insert(r.gates.end(), gates, gates + n);
    if (next_ != nullptr)
      next_->on_layer_routed(layer, batch, layout, pages, q, experts, gates, top_k);
  }

 private:
  PromptRouting& prompt_;
  const ModelSpec& spec_;
  ForwardObserver* next_;
};

}  // namespace

Engine::Engine(const Model& model, const EngineOptions& options,
               std::optional<PolicyOptions> policy)
    : model_(&model),
      layout_(model.spec(), options.num_sequences, options.kv, options.kv_capacity_pages),
      backend_(options.backend ? options.backend(model, layout_)
                               : std::make_unique<cpu::CpuBackend>(model, layout_)),
      prompts_(options.num_sequences) {
  if (policy) set_policy(*policy);
}

Engine::Engine(const Engine& other)
    : model_(other.model_),
      layout_(other.layout_),
      backend_(other.backend_->clone()),
      policy_(other.policy_),
      prompts_(other.prompts_) {}

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
  if (seq < 0 || seq >= layout_.num_sequences()) {
    fail(ErrorKind::kInvalidArgument, "prefill: sequence {} of {}", seq, layout_.num_sequences());
  }
  ForwardBatch batch;
  const int32_t start = layout_.next_position(seq);
  for (size_t i = 0; i < tokens.size(); ++i)
    batch.add(tokens[i], seq, start + static_cast<int32_t>(i));
  if (!all_logits) batch.logit_rows = {batch.size() - 1};
  if (policy_) batch.score_query = policy_->prefill_score_queries(batch.size());
  PromptRouting& prompt = prompts_.at(seq);
  prompt.tokens.insert(prompt.tokens.end(), tokens.begin(), tokens.end());
  PromptRecorder recorder(prompt, model_->spec(), observer);
  return step(batch, &recorder);
}

void Engine::compress(int seq, int prompt_len) {
  if (policy_) {
    backend_->apply(policy_->compress(layout_, seq, prompt_len, prompts_.at(seq)), layout_);
  }
}

void Engine::clear(int seq) {
  layout_.clear_sequence(seq);
  prompts_.at(seq) = {};
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
