// cpu::rms_norm and cpu::silu_mul against their formulas in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"

namespace ekva::cpu {
namespace {

TEST(RmsNorm, MatchesFormulaInPlaceAndOut) {
  std::mt19937 rng(3);
  std::normal_distribution<float> value(0.0f, 2.0f);
  const int n = 3, dim = 45;
  const double eps = 1e-6;
  std::vector<float> x(n * dim), weight(dim);
  for (float& v : x) v = value(rng);
  for (float& v : weight) v = value(rng);
  std::vector<float> out(x.size());
  rms_norm(x.data(), out.data(), n, dim, weight.data(), eps);
  for (int t = 0; t < n; ++t) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[t * dim + i]) * x[t * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) {
      EXPECT_NEAR(out[t * dim + i], x[t * dim + i] * inv * weight[i],
                  1e-6 * std::fabs(x[t * dim + i] * inv * weight[i]) + 1e-7);
    }
  }
  std::vector<float> in_place = x;
  rms_norm(in_place.data(), n, dim, weight.data(), eps);
  EXPECT_EQ(in_place, out);
}

TEST(RmsNorm, ZeroRowStaysZero) {
  std::vector<float> x(8, 0.0f), weight(8, 1.0f);
  rms_norm(x.data(), 1, 8, weight.data(), 1e-5);
  for (float v : x) EXPECT_EQ(v, 0.0f);
}

TEST(SiluMul, MatchesFormula) {
  const std::vector<float> gate = {-20.0f, -1.5f, 0.0f, 0.5f, 3.0f, 30.0f};
  const std::vector<float> up = {2.0f, -1.0f, 4.0f, 1.0f, 0.5f, -2.0f};
  std::vector<float> out(gate.size());
  silu_mul(gate.data(), up.data(), out.data(), gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(out[i], expected, 1e-6 * std::fabs(expected) + 1e-12) << "i " << i;
  }
}

}  // namespace
}  // namespace ekva::cpu
