#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>

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

  bool reads_kv() const override { return next_ != nullptr && next_->reads_kv(); }
  bool reads_expert_outputs() const override {
    return next_ != nullptr && next_->reads_expert_outputs();
  }
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
      device_(!options.backend         ? "cpu"
              : options.device.empty() ? "unnamed device"
                                       : options.device),
      layout_(model.spec(), options.num_sequences, options.kv, options.kv_capacity_pages),
      backend_(options.backend ? options.backend(model, layout_)
                               : std::make_unique<cpu::CpuBackend>(model, layout_)),
      policies_(options.num_sequences),
      prompts_(options.num_sequences) {
  if (policy) set_policy(*policy);
}

Engine::Engine(const Engine& other)
    : model_(other.model_),
      device_(other.device_),
      layout_(other.layout_),
      backend_(other.backend_->clone()),
      policies_(other.policies_),
      prompts_(other.prompts_) {}

void Engine::check_sequence(const char* what, int seq) const {
  if (seq < 0 || seq >= layout_.num_sequences()) {
    fail(ErrorKind::kInvalidArgument, "{}: sequence {} of {}", what, seq, layout_.num_sequences());
  }
}

const KvPolicy* Engine::policy(int seq) const {
  check_sequence("policy", seq);
  return policies_[seq] ? &*policies_[seq] : nullptr;
}

void Engine::set_policy(const PolicyOptions& options) {
  for (int seq = 0; seq < layout_.num_sequences(); ++seq) set_policy(seq, options);
}

void Engine::set_policy(int seq, const PolicyOptions& options) {
  check_sequence("set_policy", seq);
  KvPolicy policy(options, model_->spec());
  check_backend(policy);
  policies_[seq].emplace(std::move(policy));
}

void Engine::check_policy(const PolicyOptions& options) const {
  check_backend(KvPolicy(options, model_->spec()));
}

void Engine::check_backend(const KvPolicy& policy) const {
  if (policy.ranks_keys() && backend_->host_pages() == nullptr) {
    fail(ErrorKind::kUnsupported,
         "KV policy '{}' ranks the cached keys on the host, but the {} backend keeps them on the "
         "device; run it on the CPU (--device cpu)",
         policy.options().name, device_);
  }
}

void Engine::score_keys(int seq) {
  const KvPolicy& policy = *policies_[seq];
  if (policy.ranks_keys()) policy.score_keys(layout_, *backend_->host_pages(), seq);
}

std::vector<float> Engine::step(const ForwardBatch& batch, ForwardObserver* observer) {
  const StepPlan plan = plan_step(model_->spec(), batch, layout_);
  std::vector<float> logits = backend_->run(plan, layout_, observer);
  // x * 0 is 0 for a finite x and NaN otherwise, and NaN propagates through the sum: a pass in
  // SIMD lanes, where a search for the first bad value goes one value at a time (a decode step of
  // 40 sequences of a 32k vocabulary has 1.3M logits). The search runs only after a hit.
  float poison = 0.0f;
  const float* values = logits.data();
  const size_t count = logits.size();
#pragma omp simd reduction(+ : poison)
  for (size_t i = 0; i < count; ++i) poison += values[i] * 0.0f;
  const auto bad = poison == 0.0f ? logits.end()
                                  : std::find_if(logits.begin(), logits.end(),
                                                 [](float x) { return !std::isfinite(x); });
  if (bad != logits.end()) {
    const int vocab = model_->spec().vocab_size;
    fail_not_finite(plan, static_cast<size_t>(bad - logits.begin()) / vocab,
                    (bad - logits.begin()) % vocab);
  }
  return logits;
}

void Engine::fail_not_finite(const StepPlan& plan, size_t row, int64_t entry) const {
  fail(ErrorKind::kInvalidFile,
       "{}: the model's logits are not finite (token {} of the step, vocabulary entry {}); its "
       "weights hold NaN or Inf values or overflow",
       model_->dir().string(), plan.logit_rows[row], entry);
}

std::vector<float> Engine::prefill_batch(int seq, std::span<const int32_t> tokens, bool all_logits,
                                         ForwardObserver* observer,
                                         std::vector<uint8_t> score_query) {
  ForwardBatch batch;
  const int32_t start = layout_.next_position(seq);
  for (size_t i = 0; i < tokens.size(); ++i)
    batch.add(tokens[i], seq, start + static_cast<int32_t>(i));
  if (!all_logits) batch.logit_rows = {batch.size() - 1};
  batch.score_query = std::move(score_query);
  PromptRouting& prompt = prompts_.at(seq);
  prompt.tokens.insert(prompt.tokens.end(), tokens.begin(), tokens.end());
  PromptRecorder recorder(prompt, model_->spec(), observer);
  return step(batch, &recorder);
}

std::vector<float> Engine::prefill(int seq, std::span<const int32_t> tokens, bool all_logits,
                                   ForwardObserver* observer) {
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "prefill: no tokens");
  check_sequence("prefill", seq);
  const KvPolicy* p = policy(seq);
  std::vector<uint8_t> score_query;
  if (p != nullptr) score_query = p->prefill_score_queries(static_cast<int>(tokens.size()));
  return prefill_batch(seq, tokens, all_logits, observer, std::move(score_query));
}

std::vector<float> Engine::prefill_chunk(int seq, std::span<const int32_t> tokens, int prompt_len) {
  if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "prefill: no tokens");
  check_sequence("prefill", seq);
  const int32_t start = layout_.next_position(seq);
  if (start + static_cast<int64_t>(tokens.size()) > prompt_len) {
    fail(ErrorKind::kInvalidArgument,
         "prefill: a chunk of {} tokens from position {} runs past the prompt's {}", tokens.size(),
         start, prompt_len);
  }
  const KvPolicy* p = policy(seq);
  std::vector<uint8_t> score_query;
  if (p != nullptr) {
    const std::vector<uint8_t> prompt_queries = p->prefill_score_queries(prompt_len);
    score_query.assign(prompt_queries.begin() + start,
                       prompt_queries.begin() + start + static_cast<ptrdiff_t>(tokens.size()));
  }
  return prefill_batch(seq, tokens, false, nullptr, std::move(score_query));
}

void Engine::compress(int seq, int prompt_len) {
  check_sequence("compress", seq);
  if (policies_[seq]) {
    score_keys(seq);
    backend_->sync_scores(seq, layout_);
    backend_->apply(policies_[seq]->compress(layout_, seq, prompt_len, prompts_.at(seq)), layout_);
  }
}

void Engine::clear(int seq) {
  layout_.clear_sequence(seq);
  prompts_.at(seq) = {};
}

std::vector<float> Engine::decode(int seq, int32_t token) {
  return decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&token, 1));
}

std::vector<float> Engine::decode(std::span<const int> seqs, std::span<const int32_t> tokens) {
  std::vector<float> logits;
  decode_step(seqs, tokens, [&](const ForwardBatch& batch) { logits = step(batch); });
  return logits;
}

std::vector<int32_t> Engine::decode_tokens(std::span<const int> seqs,
                                           std::span<const int32_t> tokens,
                                           std::span<const TokenDraw> draws) {
  if (draws.size() != seqs.size()) {
    fail(ErrorKind::kInvalidArgument, "decode: {} sequences but {} draws", seqs.size(),
         draws.size());
  }
  for (const TokenDraw& d : draws) check_draw(d);
  std::vector<int32_t> next;
  decode_step(seqs, tokens, [&](const ForwardBatch& batch) {
    const StepPlan plan = plan_step(model_->spec(), batch, layout_);
    next = backend_->run_tokens(plan, layout_, draws);
    for (size_t row = 0; row < next.size(); ++row) {
      if (next[row] < 0) fail_not_finite(plan, row, -1 - static_cast<int64_t>(next[row]));
    }
  });
  return next;
}

void Engine::decode_step(std::span<const int> seqs, std::span<const int32_t> tokens,
                         const std::function<void(const ForwardBatch&)>& forward) {
  if (seqs.size() != tokens.size()) {
    fail(ErrorKind::kInvalidArgument, "decode: {} sequences but {} tokens", seqs.size(),
         tokens.size());
  }
  ForwardBatch batch;
  bool scores = false;
  for (size_t i = 0; i < seqs.size(); ++i) {
    check_sequence("decode", seqs[i]);
    if (std::find(seqs.begin(), seqs.begin() + static_cast<ptrdiff_t>(i), seqs[i]) !=
        seqs.begin() + static_cast<ptrdiff_t>(i)) {
      fail(ErrorKind::kInvalidArgument, "decode: sequence {} appears twice", seqs[i]);
    }
    batch.add(tokens[i], seqs[i], layout_.next_position(seqs[i]));
    const KvPolicy* p = policy(seqs[i]);
    const bool scored = p != nullptr && p->scores_decode();
    batch.score_query.push_back(static_cast<uint8_t>(scored));
    scores = scores || scored;
  }
  if (!scores) batch.score_query.clear();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  forward(batch);
  const auto forwarded = Clock::now();
  // Each sequence's plan reads its own tables only, so the step's evictions run in one pass, and
  // the plans (one segment per table) are made on all threads when they are many.
  std::vector<int> evicting;
  for (const int seq : seqs) {
    if (!policies_[seq]) continue;
    score_keys(seq);
    if (policies_[seq]->evicts_by_groups()) backend_->sync_scores(seq, layout_);
    evicting.push_back(seq);
  }
  const int num_plans = static_cast<int>(evicting.size());
  std::vector<EvictionPlan> plans(evicting.size());
  std::vector<std::exception_ptr> failures(evicting.size());  // none may leave the region
  [[maybe_unused]] const bool parallel =
      static_cast<int64_t>(num_plans) * layout_.num_layers() * layout_.num_kv_heads() >=
      kParallelTables;
#pragma omp parallel for schedule(static) if (parallel)
  for (int i = 0; i < num_plans; ++i) {
    try {
      plans[i] = policies_[evicting[i]]->evict(layout_, evicting[i]);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  if (!plans.empty()) backend_->apply_all(plans, layout_);
  last_decode_.forward_s = std::chrono::duration<double>(forwarded - start).count();
  last_decode_.evict_s = std::chrono::duration<double>(Clock::now() - forwarded).count();
}

int64_t Engine::pages_bound(int seq, int decode_steps) const {
  check_sequence("pages_bound", seq);
  const KvPolicy* p = policy(seq);
  const bool evicts = p != nullptr && !p->keeps_everything();
  const int64_t page = layout_.page_size();
  int64_t pages = 0;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    for (int h = 0; h < layout_.num_kv_heads(); ++h) {
      const HeadTable& t = layout_.table(seq, l, h);
      int64_t peak = t.size() + static_cast<int64_t>(decode_steps);
      // A step appends before it evicts, so a table briefly holds one slot over its budget.
      if (evicts && decode_steps > 0) {
        peak = std::min<int64_t>(peak, std::max(t.size(), p->head_budget(seq, l, h)) + 1);
      }
      pages += std::max<int64_t>(static_cast<int64_t>(t.pages.size()), (peak + page - 1) / page);
    }
  }
  return pages;
}

}  // namespace ekva
