// cpu::Rope: the rotate-half rotation by position * theta^(-2i/d) (against the formula in double),
// what makes it rotary (norms kept, q.k depends on the position difference alone), and the linear
// and YaRN scalings.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"

namespace ekva::cpu {
namespace {

constexpr int kDim = 64;

std::vector<float> random_heads(int heads, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(heads) * kDim);
  for (float& v : x) v = value(rng);
  return x;
}

// One head of kDim rotated to `position` under `spec`.
std::vector<float> rotated(const RopeSpec& spec, std::vector<float> x, int32_t position) {
  Rope(spec, kDim).apply(x.data(), 1, 1, &position);
  return x;
}

double dot(const float* a, const float* b) {
  double s = 0;
  for (int i = 0; i < kDim; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

TEST(Rope, RotatesHalvesByPositionTimesFrequency) {
  std::mt19937 rng(1);
  const std::vector<float> x = random_heads(2, rng);
  RopeSpec spec;
  spec.theta = 10000.0;
  const Rope rope(spec, kDim);
  const std::vector<int32_t> positions = {0, 7};
  std::vector<float> y = x;
  y.insert(y.end(), x.begin(), x.end());  // token 0 and token 1, the same two heads
  rope.apply(y.data(), 2, 2, positions.data());
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 2; ++h) {
      const float* in = x.data() + h * kDim;
      const float* out = y.data() + (t * 2 + h) * kDim;
      for (int i = 0; i < kDim / 2; ++i) {
        const double angle = positions[t] * std::pow(spec.theta, -2.0 * i / kDim);
        const double a = in[i], b = in[i + kDim / 2];
        EXPECT_NEAR(out[i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(out[i + kDim / 2], b * std::cos(angle) + a * std::sin(angle), 1e-5);
      }
    }
  }
}

TEST(Rope, KeepsNormsAndDependsOnPositionDifferenceOnly) {
  std::mt19937 rng(2);
  const std::vector<float> qk = random_heads(2, rng);  // head 0: q, head 1: k
  const Rope rope(RopeSpec{}, kDim);
  const auto rotated_dot = [&](int32_t q_pos, int32_t k_pos) {
    std::vector<float> q(qk.begin(), qk.begin() + kDim), k(qk.begin() + kDim, qk.end());
    rope.apply(q.data(), 1, 1, &q_pos);
    rope.apply(k.data(), 1, 1, &k_pos);
    EXPECT_NEAR(dot(q.data(), q.data()), dot(qk.data(), qk.data()), 1e-4);
    return dot(q.data(), k.data());
  };
  const double near = rotated_dot(10, 3);
  EXPECT_NEAR(rotated_dot(110, 103), near, 1e-3);
  EXPECT_NEAR(rotated_dot(1010, 1003), near, 1e-3);
  EXPECT_GT(std::fabs(rotated_dot(10, 9) - near), 1e-3);  // another difference, another product
}

TEST(Rope, LinearScalingDividesPositions) {
  std::mt19937 rng(3);
  const std::vector<float> x = random_heads(1, rng);
  RopeSpec scaled;
  scaled.scaling = RopeScaling::kLinear;
  scaled.factor = 4.0;
  const std::vector<float> a = rotated(scaled, x, 40);
  const std::vector<float> b = rotated(RopeSpec{}, x, 10);
  for (int i = 0; i < kDim; ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "i " << i;
}

TEST(Rope, YarnScalesByAttentionFactorAndKeepsHighFrequencies) {
  std::mt19937 rng(4);
  const std::vector<float> x = random_heads(1, rng);
  RopeSpec yarn;
  yarn.scaling = RopeScaling::kYarn;
  yarn.factor = 4.0;
  yarn.original_max_position = 4096;
  yarn.attention_factor = 1.2;
  const std::vector<float> a = rotated(yarn, x, 5);
  const std::vector<float> b = rotated(RopeSpec{}, x, 5);
  EXPECT_NEAR(std::sqrt(dot(a.data(), a.data())), 1.2 * std::sqrt(dot(x.data(), x.data())), 1e-4);
  // Pair 0 has the shortest wavelength: YaRN leaves its frequency as it is.
  EXPECT_NEAR(a[0], 1.2 * b[0], 1e-5);
  EXPECT_NEAR(a[kDim / 2], 1.2 * b[kDim / 2], 1e-5);
}

}  // namespace
}  // namespace ekva::cpu
