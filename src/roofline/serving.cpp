#include "roofline/serving.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "core/error.h"

namespace ekva {

namespace {

void check(const ServingConfig& c) {
  if (!(c.kv_memory_bytes > 0) || !std::isfinite(c.kv_memory_bytes) || c.prompt_tokens < 1 ||
      c.max_tokens < 1 || c.page_size < 1 || c.max_sequences < 0 || !(c.budget > 0) ||
      !std::isfinite(c.budget)) {
    fail(ErrorKind::kInvalidArgument,
         "serving prediction: KV memory {} bytes, prompt {}, max tokens {}, page size {}, max "
         "sequences {} and budget {} must be positive (max sequences 0: no limit)",
         c.kv_memory_bytes, c.prompt_tokens, c.max_tokens, c.page_size, c.max_sequences, c.budget);
  }
}

// Round(budget x prompt) tokens per (layer, KV head), the policies' meaning of a fraction.
int64_t budget_tokens(const ModelSpec& spec, const ServingConfig& c) {
  return std::clamp<int64_t>(std::llround(c.budget * static_cast<double>(c.prompt_tokens)), 1,
                             std::max(spec.max_position, 1));
}

// Mean tokens in a sequence's context over its decode, and what its attention reads of them.
std::pair<double, double> decode_tokens(const ModelSpec& spec, const ServingConfig& c) {
  const double context =
      static_cast<double>(c.prompt_tokens) + static_cast<double>(c.max_tokens) / 2.0;
  if (c.budget >= 1.0) return {context, context};
  // The kept tokens and the one a step appends before it evicts.
  return {context, static_cast<double>(std::min(c.prompt_tokens, budget_tokens(spec, c))) + 1.0};
}

}  // namespace

StepCost serving_step(const ModelSpec& spec, const HardwareSpec& hw, const ServingConfig& c,
                      int64_t batch, bool datasheet_only) {
  check(c);
  if (batch < 1) fail(ErrorKind::kInvalidArgument, "serving step: batch {} < 1", batch);
  const auto [context, kept] = decode_tokens(spec, c);
  Workload w = c.base;
  w.phase = Phase::kDecode;
  w.batch = batch;
  w.context = std::llround(context);
  w.retained.tokens.assign(static_cast<size_t>(spec.num_layers) * spec.num_kv_heads,
                           std::min(kept, static_cast<double>(w.context)));
  return predict_step(spec, hw, w, datasheet_only);
}

ServingPrediction predict_serving(const ModelSpec& spec, const HardwareSpec& hw,
                                  const ServingConfig& c, bool datasheet_only) {
  check(c);
  const int64_t P = c.prompt_tokens, T = c.max_tokens, page = c.page_size;
  const int64_t segments = static_cast<int64_t>(spec.num_layers) * spec.num_kv_heads;
  const auto pages = [&](int64_t tokens) { return segments * ((tokens + page - 1) / page); };
  const bool full = c.budget >= 1.0;
  ServingPrediction p;
  p.page_bytes =
      2.0 * static_cast<double>(page) * spec.head_dim * number_format_bytes(c.base.kv_format);
  p.capacity_pages = static_cast<int64_t>(std::floor(c.kv_memory_bytes / p.page_bytes));
  // Scheduler::pages_to_admit: the prompt and every output token but the last (which is sampled,
  // never stored).
  p.admit_pages = pages(P + T - 1);
  // Engine::pages_bound after compression: the budget, and the token a decode step appends
  // before it evicts.
  const int64_t b = budget_tokens(spec, c);
  const int64_t kept_after_prompt = std::min(P, b);
  p.kept_pages = full ? p.admit_pages
                      : pages(T > 1 ? std::min(P + T - 1, std::max(kept_after_prompt, b) + 1)
                                    : kept_after_prompt);
  std::tie(p.context, p.kept_tokens) = decode_tokens(spec, c);
  p.limited_by = "memory";
  if (p.capacity_pages < p.admit_pages) return p;
  p.sequences = 1 + (p.capacity_pages - p.admit_pages) / p.kept_pages;
  if (c.max_sequences > 0 && p.sequences > c.max_sequences) {
    p.sequences = c.max_sequences;
    p.limited_by = "max sequences";
  }
  p.step = serving_step(spec, hw, c, p.sequences, datasheet_only);
  p.tokens_per_s = static_cast<double>(p.sequences) / p.step.time_s;
  return p;
}

}  // namespace ekva
