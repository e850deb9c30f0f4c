#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (!std::isfinite(options.temperature) || options.temperature < 0.0f) {
    fail(ErrorKind::kInvalidArgument, "temperature must be a finite number >= 0, got {}",
         options.temperature);
  }
  if (!(options.top_p > 0.0f && options.top_p <= 1.0f)) {
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

GenerateResult generate(Engine& engine, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options) {
  const ModelSpec& s = engine.model().spec();
  const KvLayout& layout = engine.layout();
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (options.max_new_tokens < 0) fail(ErrorKind::kInvalidArgument, "max-new-tokens must be >= 0");
  if (static_cast<int64_t>(prompt.size()) > s.max_position) {
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens, longer than the model's context of {}", prompt.size(),
         s.max_position);
  }
  if (layout.next_position(0) != 0)
    fail(ErrorKind::kInvalidArgument, "generate needs an empty cache");
  using Clock = std::chrono::steady_clock;
  Sampler sampler(options.sampling);
  GenerateResult r;

  auto t0 = Clock::now();
  std::vector<float> logits = engine.prefill(0, prompt);
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.prefill_tokens = static_cast<int>(prompt.size());
  engine.compress(0, r.prefill_tokens);

  t0 = Clock::now();
  // Stop at the context end rather than fail: the prompt fitted, so what was generated is valid.
  const int budget = static_cast<int>(std::min<int64_t>(
      options.max_new_tokens, s.max_position - static_cast<int64_t>(prompt.size()) + 1));
  for (int i = 0; i < budget; ++i) {
    const int32_t next = sampler.sample(logits.data(), s.vocab_size);
    r.tokens.push_back(next);
    if (options.stop_at_eos &&
        std::find(s.eos_ids.begin(), s.eos_ids.end(), next) != s.eos_ids.end()) {
      r.stopped_at_eos = true;
      break;
    }
    if (i + 1 == budget) break;
    logits = engine.decode(0, next);
    ++r.decode_steps;
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  r.kv_bytes = layout.kv_bytes_in_use();
  r.retained_tokens = layout.retained_tokens();
  r.total_tokens =
      static_cast<size_t>(layout.next_position(0)) * layout.num_layers() * layout.num_kv_heads();
  r.kv_bytes_full = layout.full_bytes(layout.next_position(0));
  return r;
}

}  // namespace ekva
