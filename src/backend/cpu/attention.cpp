#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/ops.h"

namespace ekva::cpu {

void attention(const KvCache& cache, int layer, const float* q, const int32_t* seq,
               const int32_t* pos, int n, int num_heads, float* out) {
  const int d = cache.head_dim();
  const int group = num_heads / cache.num_kv_heads();
  const int page = cache.page_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
  {
    std::vector<float> scores;
    std::vector<float> acc(d);
#pragma omp for schedule(dynamic, 4)
    for (int64_t work = 0; work < static_cast<int64_t>(n) * num_heads; ++work) {
      const int t = static_cast<int>(work / num_heads);
      const int h = static_cast<int>(work % num_heads);
      const HeadTable& table = cache.table(seq[t], layer, h / group);
      const float* qv = q + (static_cast<size_t>(t) * num_heads + h) * d;
      const int len = table.size();
      scores.resize(len);
      float max_score = -std::numeric_limits<float>::infinity();
      for (int s = 0; s < len; ++s) {
        if (table.meta[s].position > pos[t]) {
          scores[s] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* k =
            cache.pool().keys(table.pages[s / page]) + static_cast<size_t>(s % page) * d;
        float dot = 0.0f;
        for (int i = 0; i < d; ++i) dot += qv[i] * k[i];
        scores[s] = dot * scale;
        max_score = std::max(max_score, scores[s]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float denom = 0.0f;
      for (int s = 0; s < len; ++s) {
        if (scores[s] == -std::numeric_limits<float>::infinity()) continue;
        const float p = std::exp(scores[s] - max_score);
        denom += p;
        const float* v =
            cache.pool().values(table.pages[s / page]) + static_cast<size_t>(s % page) * d;
        for (int i = 0; i < d; ++i) acc[i] += p * v[i];
      }
      float* o = out + (static_cast<size_t>(t) * num_heads + h) * d;
      const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
      for (int i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
  }
}

}  // namespace ekva::cpu
