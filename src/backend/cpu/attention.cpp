#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace ekva::cpu {

void attention_weights(const KvPages& pages, const HeadTable& table, const float* q, int query_pos,
                       float* weights) {
  const int d = pages.head_dim();
  const int page = pages.page_size();
  std::vector<float> scratch(pages.dtype() == DType::kF32 ? 0 : d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int len = table.size();
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  float max_score = kMasked;
  for (int i = 0; i < len; ++i) {
    if (table.meta[i].position > query_pos) {
      weights[i] = kMasked;
      continue;
    }
    const float* k = pages.key({table.pages[i / page], i % page}, scratch.data());
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < d; ++j) dot += q[j] * k[j];
    weights[i] = dot * scale;
    max_score = std::max(max_score, weights[i]);
  }
  float denom = 0.0f;
  for (int i = 0; i < len; ++i) {
    weights[i] = weights[i] == kMasked ? 0.0f : std::exp(weights[i] - max_score);
    denom += weights[i];
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
  for (int i = 0; i < len; ++i) weights[i] *= inv;
}

// One work item per (sequence, KV head): its K/V pages are read by all of the group's query heads
// while cached, and score updates to its slots need no synchronisation.
void attention(KvLayout& layout, const KvPages& pages, int layer, const float* q,
               const int32_t* seq, const int32_t* pos, int n, int num_heads, float* out,
               const uint8_t* score_query) {
  const int d = layout.head_dim();
  const int kv_heads = layout.num_kv_heads();
  const int group = num_heads / kv_heads;
  const int page = layout.page_size();
  std::vector<std::vector<int>> tokens_of(layout.num_sequences());
  for (int t = 0; t < n; ++t) tokens_of[seq[t]].push_back(t);
  std::vector<std::pair<int, int>> work;
  for (int s = 0; s < layout.num_sequences(); ++s) {
    if (tokens_of[s].empty()) continue;
    for (int h = 0; h < kv_heads; ++h) work.emplace_back(s, h);
  }
#pragma omp parallel
  {
    std::vector<float> weights, acc(d), scratch(d);
#pragma omp for schedule(dynamic, 1)
    for (size_t w = 0; w < work.size(); ++w) {
      const auto [s, kv] = work[w];
      HeadTable& table = layout.table(s, layer, kv);
      const int len = table.size();
      weights.resize(len);
      for (int t : tokens_of[s]) {
        for (int h = kv * group; h < (kv + 1) * group; ++h) {
          attention_weights(pages, table, q + (static_cast<size_t>(t) * num_heads + h) * d, pos[t],
                            weights.data());
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int i = 0; i < len; ++i) {
            if (weights[i] == 0.0f) continue;
            const float p = weights[i];
            const float* v = pages.value({table.pages[i / page], i % page}, scratch.data());
#pragma omp simd
            for (int j = 0; j < d; ++j) acc[j] += p * v[j];
          }
          if (score_query != nullptr && score_query[t] != 0) {
            for (int i = 0; i < len; ++i) table.meta[i].score += weights[i];
          }
          std::copy(acc.begin(), acc.end(), out + (static_cast<size_t>(t) * num_heads + h) * d);
        }
      }
    }
  }
}

}  // namespace ekva::cpu
