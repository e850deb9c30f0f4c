// The backend seam's own rules (backend/backend.h), apart from any one backend.
#include "backend/backend.h"

#include <gtest/gtest.h>

namespace ekva {
namespace {

// Grouped products for any step of up to 64 tokens, and for larger steps while the experts
// average at most 512 pairs: a fine-grained model's 4k prompt (Qwen3: 128 experts, top-8) is
// grouped, a coarse one's (Mixtral: 8 experts, top-2) is one GEMM per expert.
TEST(RoutedExpertsGrouped, SmallStepsAndFewPairsPerExpert) {
  EXPECT_TRUE(routed_experts_grouped(1, 2, 8));
  EXPECT_TRUE(routed_experts_grouped(kMaxGroupedStepTokens, 8, 1));
  EXPECT_TRUE(routed_experts_grouped(4096, 8, 128));  // 256 pairs per expert
  EXPECT_TRUE(routed_experts_grouped(2048, 2, 8));    // 512: the bound is inclusive
  EXPECT_FALSE(routed_experts_grouped(2049, 2, 8));
  EXPECT_FALSE(routed_experts_grouped(4096, 2, 8));  // 1024 pairs per expert
  EXPECT_FALSE(routed_experts_grouped(kMaxGroupedStepTokens + 1, 8, 1));
}

}  // namespace
}  // namespace ekva
