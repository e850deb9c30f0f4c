// cpu::linear and cpu::matrix_row against double-precision products over the same weights, for
// every weight dtype, on both paths (the streaming GEMV for few rows, sgemm above) and widths that
// leave vector tails.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/dtype.h"

namespace ekva::cpu {
namespace {

// Random weights of `dtype` in [-1, 1], and the float32 value of each.
struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  std::vector<float> value;
  WeightMatrix matrix;
};

Weights make_weights(DType dtype, int rows, int cols, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  Weights w;
  const size_t n = static_cast<size_t>(rows) * cols;
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      w.f32.push_back(u(rng));
      w.value.push_back(w.f32.back());
    } else if (dtype == DType::kBF16) {
      w.half.push_back(f32_to_bf16(u(rng)));
      w.value.push_back(bf16_to_f32(w.half.back()));
    } else {
      // f16 with exponent field 1..14: normal numbers of magnitude below 1
      const uint16_t h = static_cast<uint16_t>((bits(rng) & 0x83ff) | ((1 + bits(rng) % 14) << 10));
      w.half.push_back(h);
      w.value.push_back(f16_to_f32(h));
    }
  }
  w.matrix = {dtype, dtype == DType::kF32 ? static_cast<const void*>(w.f32.data()) : w.half.data(),
              rows, cols};
  return w;
}

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesDoubleProductOnBothPaths) {
  std::mt19937 rng(5);
  std::normal_distribution<float> x_value(0.0f, 1.0f);
  for (int cols : {8, 37, 200}) {
    const int rows = 19;
    const Weights w = make_weights(GetParam(), rows, cols, rng);
    std::vector<float> bias(rows);
    for (float& b : bias) b = x_value(rng);
    for (int n : {1, 2, 4, 5, 9}) {
      SCOPED_TRACE(::testing::Message() << "cols " << cols << " rows of x " << n);
      std::vector<float> x(static_cast<size_t>(n) * cols);
      for (float& v : x) v = x_value(rng);
      for (const float* b :
           {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
        std::vector<float> y(static_cast<size_t>(n) * rows, NAN);
        linear(w.matrix, x.data(), n, y.data(), b);
        for (int t = 0; t < n; ++t) {
          for (int r = 0; r < rows; ++r) {
            double expected = b != nullptr ? b[r] : 0.0;
            double magnitude = std::fabs(expected);
            for (int c = 0; c < cols; ++c) {
              const double term = static_cast<double>(x[static_cast<size_t>(t) * cols + c]) *
                                  w.value[static_cast<size_t>(r) * cols + c];
              expected += term;
              magnitude += std::fabs(term);
            }
            ASSERT_NEAR(y[static_cast<size_t>(t) * rows + r], expected, 1e-6 * magnitude + 1e-7)
                << "row " << t << " out " << r;
          }
        }
      }
    }
  }
}

TEST_P(LinearTest, MatrixRowConvertsOneRow) {
  std::mt19937 rng(6);
  const Weights w = make_weights(GetParam(), 5, 13, rng);
  std::vector<float> row(13);
  matrix_row(w.matrix, 3, row.data());
  for (int c = 0; c < 13; ++c) EXPECT_EQ(row[c], w.value[3 * 13 + c]) << "col " << c;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LinearTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& p) {
                           return std::string(dtype_name(p.param));
                         });

TEST(LinearProducts, OneCallGivesWhatEachProductGivesAlone) {
  std::mt19937 rng(8);
  std::normal_distribution<float> value(0.0f, 1.0f);
  const Weights a = make_weights(DType::kBF16, 7, 24, rng);
  const Weights b = make_weights(DType::kF32, 3, 24, rng);
  const Weights c = make_weights(DType::kF16, 11, 40, rng);
  std::vector<float> bias(3);
  for (float& v : bias) v = value(rng);
  // Rows of x per product: all streamed, all through sgemm, and mixed in one call.
  for (const auto& n :
       {std::array<int, 3>{1, 1, 1}, std::array<int, 3>{4, 6, 9}, std::array<int, 3>{2, 5, 3}}) {
    SCOPED_TRACE(::testing::Message() << "rows of x " << n[0] << " " << n[1] << " " << n[2]);
    std::vector<float> xa(n[0] * 24), xb(n[1] * 24), xc(n[2] * 40);
    for (auto* x : {&xa, &xb, &xc}) {
      for (float& v : *x) v = value(rng);
    }
    std::vector<float> ya(n[0] * 7), yb(n[1] * 3), yc(n[2] * 11), alone;
    const Product products[] = {{&a.matrix, xa.data(), n[0], ya.data()},
                                {&b.matrix, xb.data(), n[1], yb.data(), bias.data()},
                                {&c.matrix, xc.data(), n[2], yc.data()}};
    linear(products);
    for (const Product& p : products) {
      alone.assign(static_cast<size_t>(p.n) * p.w->rows, NAN);
      linear(*p.w, p.x, p.n, alone.data(), p.bias);
      EXPECT_EQ(std::vector<float>(p.y, p.y + alone.size()), alone);
    }
  }
}

}  // namespace
}  // namespace ekva::cpu
