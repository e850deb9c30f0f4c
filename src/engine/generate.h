#pragma once
// Token sampling and the prefill-then-decode generation loop.
#include <cstdint>
#include <random>
#include <vector>

#include "backend/token_draw.h"
#include "engine/engine.h"

namespace ekva {

struct SamplingOptions {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
};

// A sequence's draws: its options and the next uniform number of its seeded generator each time.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  // The next token's draw (draw_token's terms), for a backend that draws where the logits are.
  TokenDraw next_draw();
  // draw_token over logits on the host, with the next draw.
  int32_t sample(const float* logits, int vocab);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
};

struct GenerateOptions {
  int max_new_tokens = 32;
  SamplingOptions sampling;
  bool stop_at_eos = true;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids only
  bool stopped_at_eos = false;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int prefill_tokens = 0;
  int decode_steps = 0;
  size_t kv_bytes = 0;         // K/V pages in use at the end
  size_t kv_bytes_full = 0;    // what a full cache would hold for the same tokens
  size_t retained_tokens = 0;  // summed over (layer, KV head) tables
  size_t total_tokens = 0;     // the same for a full cache
};

// Generates for sequence 0 of the engine, which must be empty. The engine's policy compresses the
// cache after prefill and evicts after each decode step; without one everything is kept.
GenerateResult generate(Engine& engine, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options);

}  // namespace ekva
