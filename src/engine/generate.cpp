#include "engine/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace ekva {

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  check_draw(TokenDraw{options.temperature, options.top_k, options.top_p, 0.0});
}

TokenDraw Sampler::next_draw() {
  TokenDraw draw{options_.temperature, options_.top_k, options_.top_p, 0.0};
  if (options_.temperature > 0.0f) draw.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return draw;
}

int32_t Sampler::sample(const float* logits, int vocab) {
  const int32_t token = draw_token(logits, vocab, next_draw());
  if (token < 0) {
    fail(ErrorKind::kInvalidArgument, "sample: logit {} of {} is not finite", -1 - token, vocab);
  }
  return token;
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
  // Each next token is drawn by the engine where the logits are.
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
    const TokenDraw draw = sampler.next_draw();
    next = engine.decode_tokens(std::span<const int>(&seq, 1), std::span<const int32_t>(&next, 1),
                                std::span<const TokenDraw>(&draw, 1))[0];
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
