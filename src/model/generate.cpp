#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/forward.h"

namespace ekva {

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (options.top_p <= 0.0f || options.top_p > 1.0f) {
    fail(ErrorKind::kInvalidArgument, "top-p must be in (0, 1], got {}", options.top_p);
  }
  if (options.top_k < 0)
    fail(ErrorKind::kInvalidArgument, "top-k must be >= 0, got {}", options.top_k);
}

int32_t Sampler::sample(const float* logits, int vocab) {
  if (options_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  size_t keep = options_.top_k > 0 ? std::min<size_t>(options_.top_k, vocab) : vocab;
  std::vector<double> p(keep);
  const double mx = logits[ids[0]];
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((logits[ids[i]] - mx) / options_.temperature);
  if (options_.top_p < 1.0f) {
    double cum = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / sum;
      if (cum >= options_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    p.resize(keep);
  }
  std::discrete_distribution<size_t> dist(p.begin(), p.end());
  return ids[dist(rng_)];
}

GenerateResult generate(const Model& model, KvCache& cache, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options, KvPolicy* policy) {
  const ModelSpec& s = model.spec();
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (options.max_new_tokens < 0) fail(ErrorKind::kInvalidArgument, "max-new-tokens must be >= 0");
  if (static_cast<int64_t>(prompt.size()) > s.max_position) {
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens, longer than the model's context of {}", prompt.size(),
         s.max_position);
  }
  if (cache.next_position(0) != 0)
    fail(ErrorKind::kInvalidArgument, "generate needs an empty cache");
  using Clock = std::chrono::steady_clock;
  Forward forward(model, cache);
  Sampler sampler(options.sampling);
  GenerateResult r;

  ForwardBatch batch;
  for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], 0, static_cast<int32_t>(i));
  batch.logit_rows = {batch.size() - 1};
  if (policy != nullptr) batch.score_query = policy->prefill_score_queries(batch.size());
  auto t0 = Clock::now();
  std::vector<float> logits = forward.run(batch);
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.prefill_tokens = batch.size();
  if (policy != nullptr) policy->compress(cache, 0, batch.size());

  t0 = Clock::now();
  // Stop at the context end rather than fail: the prompt fitted, so what was generated is valid.
  const int budget = std::min<int64_t>(options.max_new_tokens,
                                       s.max_position - static_cast<int64_t>(prompt.size()) + 1);
  for (int i = 0; i < budget; ++i) {
    const int32_t next = sampler.sample(logits.data(), s.vocab_size);
    r.tokens.push_back(next);
    if (options.stop_at_eos &&
        std::find(s.eos_ids.begin(), s.eos_ids.end(), next) != s.eos_ids.end()) {
      r.stopped_at_eos = true;
      break;
    }
    if (i + 1 == budget) break;
    ForwardBatch step;
    step.add(next, 0, cache.next_position(0));
    if (policy != nullptr) step.score_query = {static_cast<uint8_t>(policy->scores_decode())};
    logits = forward.run(step);
    ++r.decode_steps;
    if (policy != nullptr) policy->evict(cache, 0);
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.kv_bytes = cache.kv_bytes_in_use();
  r.retained_tokens = cache.retained_tokens();
  r.total_tokens =
      static_cast<size_t>(cache.next_position(0)) * cache.num_layers() * cache.num_kv_heads();
  r.kv_bytes_full = full_cache_bytes(cache, cache.next_position(0));
  return r;
}

size_t full_cache_bytes(const KvCache& cache, int64_t tokens) {
  const size_t pages_per_table =
      static_cast<size_t>((tokens + cache.page_size() - 1) / cache.page_size());
  return pages_per_table * cache.num_layers() * cache.num_kv_heads() * cache.pool().page_bytes();
}

}  // namespace ekva
