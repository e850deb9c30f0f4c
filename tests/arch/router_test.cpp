#include "arch/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace ekva {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Routed {
  std::vector<int32_t> experts;
  std::vector<float> gates;
};

Routed route(const std::vector<float>& logits, int top_k, bool renormalise) {
  Router router(static_cast<int>(logits.size()), top_k, renormalise);
  Routed r{std::vector<int32_t>(top_k), std::vector<float>(top_k)};
  router.route(logits.data(), r.experts.data(), r.gates.data());
  return r;
}

TEST(Router, SoftmaxTopKWithTiesToTheLowerId) {
  const Routed r = route({0.5f, 2.0f, 1.0f, 2.0f}, 3, false);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3, 2}));
  const double sum = std::exp(0.5) + 2 * std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(r.gates[0], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(r.gates[1], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(r.gates[2], std::exp(1.0) / sum, 1e-6);
  const Routed renormalised = route({0.5f, 2.0f, 1.0f, 2.0f}, 2, true);
  EXPECT_NEAR(renormalised.gates[0], 0.5, 1e-6);
  EXPECT_NEAR(renormalised.gates[1], 0.5, 1e-6);
}

// A diverged hidden state's logits: NaN ranks lowest, infinities as the nearest finite values; the
// picks are always distinct experts and the gates numbers.
TEST(Router, NonFiniteLogitsStillPickExperts) {
  const Routed nan = route({kNan, 1.0f, kNan, 3.0f}, 2, false);
  EXPECT_EQ(nan.experts, (std::vector<int32_t>{3, 1}));
  EXPECT_NEAR(nan.gates[0], 1 / (1 + std::exp(-2.0)), 1e-6);
  EXPECT_NEAR(nan.gates[1], std::exp(-2.0) / (1 + std::exp(-2.0)), 1e-6);

  const Routed inf = route({kNan, 1.0f, kInf, -kInf, 2.0f}, 3, true);
  EXPECT_EQ(inf.experts, (std::vector<int32_t>{2, 0, 1}));
  EXPECT_EQ(inf.gates, (std::vector<float>{1.0f, 0.0f, 0.0f}));

  const Routed all_nan = route({kNan, kNan, kNan, kNan}, 2, false);
  EXPECT_EQ(all_nan.experts, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(all_nan.gates, (std::vector<float>{0.25f, 0.25f}));
}

TEST(Router, RejectsATopKItCannotPick) {
  EXPECT_THROW(Router(4, 5, true), Error);
  EXPECT_THROW(Router(0, 1, true), Error);
}

}  // namespace
}  // namespace ekva
