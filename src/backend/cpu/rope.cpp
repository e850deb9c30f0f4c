#include <cmath>

#include "backend/cpu/ops.h"

namespace ekva::cpu {

Rope::Rope(const RopeSpec& rope, int head_dim)
    : head_dim_(head_dim), table_(make_rope_table(rope, head_dim)) {}

void Rope::apply(float* x, int n, int num_heads, const int32_t* positions) const {
  const int half = head_dim_ / 2;
  std::vector<float> cos_v(half), sin_v(half);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < half; ++i) {
      // float32 angle, as the reference implementations compute it
      const float angle = static_cast<float>(positions[t]) * static_cast<float>(table_.inv_freq[i]);
      cos_v[i] = static_cast<float>(std::cos(angle) * table_.attention_factor);
      sin_v[i] = static_cast<float>(std::sin(angle) * table_.attention_factor);
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (static_cast<size_t>(t) * num_heads + h) * head_dim_;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
}

}  // namespace ekva::cpu
