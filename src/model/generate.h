#pragma once
// Token sampling and the prefill-then-decode generation loop.
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace ekva {

struct SamplingOptions {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
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
  size_t kv_bytes = 0;  // K/V pages in use at the end
};

// Called after prefill and before each decode step; policies compress or evict here.
using CacheHook = std::function<void(KvCache&)>;

// Generates for one sequence (sequence 0 of `cache`, which must be empty).
GenerateResult generate(const Model& model, KvCache& cache, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options, const CacheHook& after_step = {});

}  // namespace ekva
