#include "backend/token_draw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace ekva {
namespace {

TEST(DrawToken, GreedyIsTheLowestIdAmongTheLargest) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(draw_token(logits.data(), 4, TokenDraw{}), 1);
}

TEST(DrawToken, NamesTheFirstEntryThatIsNotFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {0.5f, 2.0f, -inf, std::nanf("")};
  EXPECT_EQ(draw_token(logits.data(), 4, TokenDraw{}), -1 - 2);
  EXPECT_EQ(draw_token(logits.data(), 4, TokenDraw{1.0f, 0, 1.0f, 0.5}), -1 - 2);
}

// Weights 1, 1, e^-2, e^-3 at temperature 1 for ids 1 and 2 (logit 3), 0 (logit 1) and 3 (logit
// 0); u picks by where u times the kept candidates' total falls: in id order without cuts, best
// first (the lower id first among equal logits) with them.
TEST(DrawToken, InverseTransformOverTheCandidates) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f};
  const double mass = 2.0 + std::exp(-2.0) + std::exp(-3.0);
  const auto draw = [&](double u, int top_k = 0, float top_p = 1.0f) {
    return draw_token(logits.data(), 4, TokenDraw{1.0f, top_k, top_p, u});
  };
  EXPECT_EQ(draw(0.0), 0);
  EXPECT_EQ(draw(0.99 * std::exp(-2.0) / mass), 0);
  EXPECT_EQ(draw((std::exp(-2.0) + 0.5) / mass), 1);
  EXPECT_EQ(draw((std::exp(-2.0) + 1.5) / mass), 2);
  EXPECT_EQ(draw(0.999999), 3);
  EXPECT_EQ(draw(0.999999, 4), 3);  // a top-k of the whole vocabulary is no cut
  // Top-k 3 keeps ids 1, 2 and 0, in that order.
  EXPECT_EQ(draw(0.0, 3), 1);
  EXPECT_EQ(draw(1.01 / (2.0 + std::exp(-2.0)), 3), 2);
  EXPECT_EQ(draw(0.999999, 3), 0);
  // Top-k 2 keeps ids 1 and 2, each half of their total.
  EXPECT_EQ(draw(0.49, 2), 1);
  EXPECT_EQ(draw(0.51, 2), 2);
  EXPECT_EQ(draw(0.999999, 2), 2);
  // Top-p 0.5: id 1 alone holds 1 / mass < 0.5 of the total, so id 2 is kept too, and no more.
  ASSERT_LT(1.0 / mass, 0.5);
  EXPECT_EQ(draw(0.999999, 0, 0.5f), 2);
  // Top-p below id 1's share keeps it alone.
  EXPECT_EQ(draw(0.999999, 0, 0.1f), 1);
  // A high temperature flattens the weights toward equal shares.
  EXPECT_EQ(draw_token(logits.data(), 4, TokenDraw{1e6f, 0, 1.0f, 0.76}), 3);
}

TEST(DrawToken, CheckNamesTheFieldOutOfRange) {
  EXPECT_NO_THROW(check_draw(TokenDraw{0.7f, 40, 0.9f, 0.5}));
  const auto message = [](const TokenDraw& d) {
    try {
      check_draw(d);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(TokenDraw{-1.0f, 0, 1.0f, 0.0}).find("temperature"), std::string::npos);
  EXPECT_NE(message(TokenDraw{std::nanf(""), 0, 1.0f, 0.0}).find("temperature"), std::string::npos);
  EXPECT_NE(message(TokenDraw{1.0f, -3, 1.0f, 0.0}).find("top-k"), std::string::npos);
  EXPECT_NE(message(TokenDraw{1.0f, 0, 0.0f, 0.0}).find("top-p"), std::string::npos);
  EXPECT_NE(message(TokenDraw{1.0f, 0, 1.0f, 1.0}).find("u must"), std::string::npos);
  EXPECT_NE(message(TokenDraw{1.0f, 0, 1.0f, -0.1}).find("u must"), std::string::npos);
}

}  // namespace
}  // namespace ekva
