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
  // Candidates best first: higher logit, then lower id. Only as many as top-k and top-p keep are
  // put in order, since a full sort of the vocabulary costs milliseconds per token and a server
  // samples a token for every sequence of every step.
  const auto better = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  size_t keep = options_.top_k > 0 ? std::min<size_t>(options_.top_k, vocab) : vocab;
  if (keep < ids.size()) std::nth_element(ids.begin(), ids.begin() + keep, ids.end(), better);
  const double mx = *std::max_element(logits, logits + vocab);
  const auto weight = [&](int32_t id) {
    return std::exp((logits[id] - mx) / options_.temperature);
  };
  if (options_.top_p < 1.0f) {
    double sum = 0.0;
    for (size_t i = 0; i < keep; ++i) sum += weight(ids[i]);
    // Orders the candidates a stretch at a time (each twice the last) until the top-p mass is
    // reached.
    double cum = 0.0;
    size_t ordered = 0;
    bool reached = false;
    for (size_t stretch = 64; ordered < keep && !reached; stretch *= 2) {
      const size_t end = std::min(keep, ordered + stretch);
      if (end < keep)
        std::nth_element(ids.begin() + ordered, ids.begin() + end, ids.begin() + keep, better);
      std::sort(ids.begin() + ordered, ids.begin() + end, better);
      while (ordered < end && !reached) {
        cum += weight(ids[ordered++]) / sum;
        reached = cum >= options_.top_p;
      }
    }
    keep = ordered;
  } else if (keep < ids.size()) {
    std::sort(ids.begin(), ids.begin() + keep, better);
  }
  std::vector<double> p(keep);
  for (size_t i = 0; i < keep; ++i) p[i] = weight(ids[i]);
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
  // Greedy decoding takes each next token from the engine, which picks it where the logits are.
  const bool greedy = options.sampling.temperature <= 0.0f;
  int32_t next = sampler.sample(logits.data(), s.vocab_size);
  for (int i = 0; i < budget; ++i) {
    r.tokens.push_back(next);
    if (options.stop_at_eos &&
        std::find(s.eos_ids.begin(), s.eos_ids.end(), next) != s.eos_ids.end()) {
      r.stopped_at_eos = true;
      break;
    }
    if (i + 1 == budget) break;
    const int seq = 0;
    if (greedy) {
      next = engine.decode_greedy(std::span<const int>(&seq, 1),
                                  std::span<const int32_t>(&next, 1))[0];
    } else {
      logits = engine.decode(seq, next);
      next = sampler.sample(logits.data(), s.vocab_size);
    }
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
