#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "io/model_config.h"
#include "roofline/memory_model.h"
#include "roofline/search.h"
#include "support/roofline_workloads.h"

namespace ekva {
namespace {

using testing::decode;
using testing::kGiB;
using testing::mixtral;

TEST(MemoryModel, WeightsAndKvByHand) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  const Workload w = decode(16, 4096);
  const MemoryUse m = memory_use(s, hw, w, predict_step(s, hw, w), MemoryOptions{});
  EXPECT_DOUBLE_EQ(m.weight_bytes, 46702792704.0 * 2);
  EXPECT_DOUBLE_EQ(m.kv_bytes, 16.0 * 4096 * 131072);
  EXPECT_DOUBLE_EQ(m.workspace_bytes, kGiB);
  EXPECT_GT(m.activation_bytes, 0);
  EXPECT_DOUBLE_EQ(m.total_bytes,
                   m.weight_bytes + m.kv_bytes + m.activation_bytes + m.workspace_bytes);
  EXPECT_DOUBLE_EQ(m.capacity_bytes, hw.memory_bytes);
  EXPECT_TRUE(m.fits());
}

TEST(MemoryModel, LargestBatchIsTheLastThatFits) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  Workload w = decode(1, 32768);
  const int64_t largest = max_batch(s, hw, w, MemoryOptions{});
  // Roughly (139.8 GiB - 87 GiB of weights - 1 GiB) / 4 GiB of KV per 32k sequence.
  EXPECT_GE(largest, 10);
  EXPECT_LE(largest, 14);
  const auto fits = [&](int64_t b) {
    w.batch = b;
    return memory_use(s, hw, w, predict_step(s, hw, w), MemoryOptions{}).fits();
  };
  EXPECT_TRUE(fits(largest));
  EXPECT_FALSE(fits(largest + 1));
  // A quarter of the KV fits about four times the sequences.
  w.retained = KvRetention::fraction(s, 32768, 0.25);
  const int64_t compressed = max_batch(s, hw, w, MemoryOptions{});
  EXPECT_GE(compressed, 4 * largest - 4);
  // Mixtral does not fit a 24 GiB card at all.
  EXPECT_EQ(max_batch(s, find_hardware("rtx-4090"), decode(1, 1024), MemoryOptions{}), 0);
}

TEST(MemoryModel, NonFiniteOptionsAreRefused) {
  // `roofline --workspace-gib nan` passed a check written as "< 0".
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  const Workload w = decode(1, 1024);
  for (const double bytes : {std::nan(""), HUGE_VAL, -1.0}) {
    MemoryOptions o;
    o.workspace_bytes = bytes;
    EXPECT_THROW(memory_use(s, hw, w, predict_step(s, hw, w), o), Error) << bytes;
    o = MemoryOptions{};
    o.capacity_bytes = bytes;
    EXPECT_THROW(memory_use(s, hw, w, predict_step(s, hw, w), o), Error) << bytes;
  }
}

TEST(Search, NonFiniteKneeThresholdIsRefused) {
  const ModelSpec s = mixtral();
  SearchOptions options;
  options.knee_threshold = std::nan("");
  EXPECT_THROW(search_kv_budget(s, find_hardware("h200"), decode(1, 4096),
                                {TargetKind::kMemoryCap, 100 * kGiB}, options),
               Error);
}

TEST(Search, MemoryCapPicksTheBudgetAndTheKnee) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  SearchOptions options;
  options.batch_limit = 1024;
  const SearchResult r =
      search_kv_budget(s, hw, decode(1, 32768), {TargetKind::kMemoryCap, 141 * kGiB}, options);
  ASSERT_FALSE(r.points.empty());
  EXPECT_DOUBLE_EQ(r.points.front().kv_fraction, 1.0);
  EXPECT_EQ(r.chosen, 0);  // full KV fits at some batch
  for (size_t i = 1; i < r.points.size(); ++i) {
    EXPECT_LT(r.points[i].kv_fraction, r.points[i - 1].kv_fraction);
    EXPECT_GE(r.points[i].batch, r.points[i - 1].batch);
    EXPECT_TRUE(r.points[i].memory.fits());
  }
  ASSERT_GE(r.knee, 0);
  const SearchPoint& knee = r.points[r.knee];
  EXPECT_GT(knee.gain_over_full, 1.5);  // smaller KV buys a larger batch
  // Below the knee, no budget gains more than the threshold over it.
  for (size_t i = r.knee + 1; i < r.points.size(); ++i) {
    EXPECT_LE(r.points[i].objective, knee.objective * (1 + options.knee_threshold));
  }
  EXPECT_FALSE(r.knee_dominated_by.empty());
}

TEST(Search, LatencyTargetCanRequireCompression) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  // Batch 1 at 32k context, full KV: ~93 GB of weights... time the step to set a target that
  // full KV misses and a quarter of the KV meets.
  const double full = predict_step(s, hw, decode(1, 32768)).time_s;
  Workload quarter = decode(1, 32768);
  quarter.retained = KvRetention::fraction(s, 32768, 0.25);
  const double compressed = predict_step(s, hw, quarter).time_s;
  ASSERT_LT(compressed, full);
  const double target = (full + compressed) / 2;
  const SearchResult r = search_kv_budget(s, hw, decode(1, 32768),
                                          {TargetKind::kMaxTimePerToken, target}, SearchOptions{});
  EXPECT_FALSE(r.points.front().feasible);
  ASSERT_GE(r.chosen, 0);
  EXPECT_GT(r.points[r.chosen].kv_fraction, 0.25 - 1e-12);
  EXPECT_LE(r.points[r.chosen].time_s, target);
  EXPECT_EQ(r.points[r.chosen].gain_over_full, 0);  // nothing to compare with

  // Throughput target: the smallest batch that reaches it.
  const SearchResult t =
      search_kv_budget(s, hw, decode(1, 4096), {TargetKind::kMinThroughput, 2000}, SearchOptions{});
  ASSERT_EQ(t.chosen, 0);
  const SearchPoint& p = t.points[0];
  EXPECT_GE(p.tokens_per_s, 2000);
  Workload smaller = decode(p.batch - 1, 4096);
  EXPECT_LT((p.batch - 1) / predict_step(s, hw, smaller).time_s, 2000);

  EXPECT_THROW(
      search_kv_budget(s, hw, decode(1, 4096), {TargetKind::kMinThroughput, -1}, SearchOptions{}),
      Error);
}

}  // namespace
}  // namespace ekva
