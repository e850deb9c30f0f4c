#include <algorithm>
#include <cmath>
#include <numbers>

#include "backend/cpu/ops.h"

namespace ekva::cpu {
namespace {

// YaRN: the rotary dimension whose wavelength completes `rotations` turns over the original
// context.
double yarn_correction_dim(double rotations, int dim, double base, int max_position) {
  return dim * std::log(max_position / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

Rope::Rope(const RopeSpec& rope, int head_dim)
    : head_dim_(head_dim), inv_freq_(head_dim / 2), attention_factor_(1.0) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) inv_freq_[i] = 1.0 / std::pow(rope.theta, 2.0 * i / head_dim);
  switch (rope.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (double& f : inv_freq_) f /= rope.factor;
      break;
    case RopeScaling::kLlama3: {
      const double old_len = rope.original_max_position;
      const double low_wavelen = old_len / rope.low_freq_factor;
      const double high_wavelen = old_len / rope.high_freq_factor;
      for (double& f : inv_freq_) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f /= rope.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old_len / wavelen - rope.low_freq_factor) /
                                (rope.high_freq_factor - rope.low_freq_factor);
          f = (1 - smooth) * f / rope.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::kYarn: {
      double low = std::floor(
          yarn_correction_dim(rope.beta_fast, head_dim, rope.theta, rope.original_max_position));
      double high = std::ceil(
          yarn_correction_dim(rope.beta_slow, head_dim, rope.theta, rope.original_max_position));
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(head_dim - 1));
      if (low == high) high += 0.001;
      for (int i = 0; i < half; ++i) {
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        const double extrapolation_weight = 1.0 - ramp;
        const double extrapolated = inv_freq_[i];
        inv_freq_[i] = extrapolated / rope.factor * (1 - extrapolation_weight) +
                       extrapolated * extrapolation_weight;
      }
      attention_factor_ = rope.attention_factor;
      break;
    }
  }
}

void Rope::apply(float* x, int n, int num_heads, const int32_t* positions) const {
  const int half = head_dim_ / 2;
  std::vector<float> cos_v(half), sin_v(half);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < half; ++i) {
      // float32 angle, as the reference implementations compute it
      const float angle = static_cast<float>(positions[t]) * static_cast<float>(inv_freq_[i]);
      cos_v[i] = static_cast<float>(std::cos(angle) * attention_factor_);
      sin_v[i] = static_cast<float>(std::sin(angle) * attention_factor_);
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
