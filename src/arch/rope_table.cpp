#include "arch/rope_table.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ekva {
namespace {

// YaRN: the rotary dimension whose wavelength completes `rotations` turns over the original
// context.
double yarn_correction_dim(double rotations, int dim, double base, int max_position) {
  return dim * std::log(max_position / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

RopeTable make_rope_table(const RopeSpec& rope, int head_dim) {
  const int half = head_dim / 2;
  RopeTable t;
  std::vector<double>& inv_freq = t.inv_freq;
  inv_freq.resize(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(rope.theta, 2.0 * i / head_dim);
  switch (rope.scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (double& f : inv_freq) f /= rope.factor;
      break;
    case RopeScaling::kLlama3: {
      const double old_len = rope.original_max_position;
      const double low_wavelen = old_len / rope.low_freq_factor;
      const double high_wavelen = old_len / rope.high_freq_factor;
      for (double& f : inv_freq) {
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
        const double extrapolated = inv_freq[i];
        inv_freq[i] = extrapolated / rope.factor * (1 - extrapolation_weight) +
                      extrapolated * extrapolation_weight;
      }
      t.attention_factor = rope.attention_factor;
      break;
    }
  }
  return t;
}

}  // namespace ekva
