// The serving prediction: a fixed KV memory holds the sequences ekva serve's admission rule lets
// run at once, by hand for Mixtral-8x7B at 32k; the scheduler reaching the same count is
// tests/serve/scheduler_test.cpp's.
#include "roofline/serving.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "io/model_config.h"
#include "support/roofline_workloads.h"

namespace ekva {
namespace {

using testing::kGiB;
using testing::mixtral;

ServingConfig config(double budget) {
  ServingConfig c;
  c.kv_memory_bytes = 40 * kGiB;
  c.prompt_tokens = 32704;
  c.max_tokens = 64;
  c.budget = budget;
  return c;
}

TEST(Serving, MixtralAt32kByHand) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  // A page: 16 tokens of K and V, 128 dims, bf16 = 8 KiB; 256 (layer, KV head) segments.
  const ServingPrediction full = predict_serving(s, hw, config(1.0));
  EXPECT_DOUBLE_EQ(full.page_bytes, 8192.0);
  EXPECT_EQ(full.capacity_pages, 40 * 131072);
  EXPECT_EQ(full.admit_pages, 256 * 2048);  // 32704 + 63 tokens: 2048 pages a segment = 4 GiB
  EXPECT_EQ(full.kept_pages, full.admit_pages);
  EXPECT_EQ(full.sequences, 10);
  EXPECT_EQ(full.limited_by, "memory");
  EXPECT_DOUBLE_EQ(full.kept_tokens, 32704 + 32);
  EXPECT_GT(full.tokens_per_s, 0);
  EXPECT_DOUBLE_EQ(full.tokens_per_s, 10 / full.step.time_s);

  // 20%: 6541 tokens kept, 6542 during a step: 409 pages a segment. One request is prefilled at
  // its full size beside the others: 1 + (40 GiB - 4 GiB) / (256 x 409 pages).
  const ServingPrediction b20 = predict_serving(s, hw, config(0.2));
  EXPECT_EQ(b20.kept_pages, 256 * 409);
  EXPECT_EQ(b20.sequences, 1 + (40 * 131072 - 256 * 2048) / (256 * 409));
  EXPECT_DOUBLE_EQ(b20.kept_tokens, 6541 + 1);
  EXPECT_GT(b20.tokens_per_s, 3 * full.tokens_per_s);

  const ServingPrediction b10 = predict_serving(s, hw, config(0.1));
  EXPECT_EQ(b10.kept_pages, 256 * 205);  // 3270 + 1 tokens
  EXPECT_GT(b10.sequences, b20.sequences);

  ServingConfig capped = config(0.1);
  capped.max_sequences = 64;
  const ServingPrediction limited = predict_serving(s, hw, capped);
  EXPECT_EQ(limited.sequences, 64);
  EXPECT_EQ(limited.limited_by, "max sequences");
}

TEST(Serving, MemoryBelowOneRequestHoldsNone) {
  ServingConfig c = config(0.1);
  c.kv_memory_bytes = 3 * kGiB;  // less than one prompt's full cache, which admission reserves
  const ServingPrediction p = predict_serving(mixtral(), find_hardware("h200"), c);
  EXPECT_EQ(p.sequences, 0);
  EXPECT_EQ(p.tokens_per_s, 0);
}

TEST(Serving, BadConfigurationsAreRefused) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  for (int i = 0; i < 5; ++i) {
    ServingConfig c = config(0.5);
    if (i == 0) c.kv_memory_bytes = 0;
    if (i == 1) c.prompt_tokens = 0;
    if (i == 2) c.max_tokens = 0;
    if (i == 3) c.budget = -1;
    if (i == 4) c.page_size = 0;
    EXPECT_THROW(predict_serving(s, hw, c), Error) << i;
  }
}

}  // namespace
}  // namespace ekva
