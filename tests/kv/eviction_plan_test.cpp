#include "kv/eviction_plan.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace ekva {
namespace {

// Slots with positions 0..n-1 in slot order and the given scores.
HeadTable table_of(const std::vector<float>& scores) {
  HeadTable t;
  for (size_t i = 0; i < scores.size(); ++i) {
    TokenMeta m;
    m.position = static_cast<int32_t>(i);
    m.score = scores[i];
    t.meta.push_back(m);
  }
  return t;
}

std::vector<int32_t> kept(const HeadTable& t, const std::vector<uint8_t>& evict) {
  std::vector<int32_t> out;
  for (int i = 0; i < t.size(); ++i) {
    if (evict[i] == 0) out.push_back(t.meta[i].position);
  }
  return out;
}

TEST(SelectEvictions, KeepsSinksRecentThenTheBestScores) {
  const HeadTable t = table_of({0.0f, 0.9f, 0.1f, 0.8f, 0.2f, 0.7f, 0.0f, 0.0f, 0.0f, 0.0f});
  SegmentEviction s;
  s.keep = 5;
  s.sinks = 1;
  s.recent_from = 8;  // positions 8 and 9
  EXPECT_EQ(kept(t, select_evictions(t, s)), (std::vector<int32_t>{0, 1, 3, 8, 9}));
}

TEST(SelectEvictions, EqualScoresGoToTheEarlierPosition) {
  const HeadTable t = table_of({0.5f, 0.5f, 0.5f, 0.5f});
  SegmentEviction s;
  s.keep = 2;
  s.recent_from = 100;
  EXPECT_EQ(kept(t, select_evictions(t, s)), (std::vector<int32_t>{0, 1}));
}

TEST(SelectEvictions, ProtectedSlotsStayEvenBeyondKeep) {
  const HeadTable t = table_of({1, 1, 1, 1, 1, 1});
  SegmentEviction s;
  s.keep = 2;
  s.sinks = 2;
  s.recent_from = 4;
  EXPECT_EQ(kept(t, select_evictions(t, s)), (std::vector<int32_t>{0, 1, 4, 5}));
}

// Each group first keeps its best up to its quota; the room left goes to the best of the rest.
TEST(SelectEvictions, GroupQuotasComeFirst) {
  const HeadTable t = table_of({0.9f, 0.8f, 0.7f, 0.1f, 0.05f, 0.6f});
  SegmentEviction s;
  s.keep = 4;
  s.recent_from = 100;
  s.quota = {1, 2};
  s.slot_group = {0, 0, 0, 1, 1, 0};
  // group 1 keeps positions 3 and 4 by quota, group 0 keeps 0 by quota, then the best left: 1.
  EXPECT_EQ(kept(t, select_evictions(t, s)), (std::vector<int32_t>{0, 1, 3, 4}));
  s.slot_group.pop_back();
  EXPECT_THROW(select_evictions(t, s), Error);
}

TEST(PoolScores, MaxPoolsOverPositionsNotSlots) {
  HeadTable t = table_of({0, 0, 5, 0, 0, 0});
  std::swap(t.meta[0], t.meta[5]);  // slot order is not position order
  pool_scores(t, 3);
  std::vector<float> by_position(6);
  for (const TokenMeta& m : t.meta) by_position[m.position] = m.score;
  EXPECT_EQ(by_position, (std::vector<float>{0, 5, 5, 5, 0, 0}));
}

// A long prompt's selection runs its tables on all threads (kParallelSlots): the flags and the
// pooled scores must be those of each table selected on its own.
TEST(SelectPlanEvictions, ALongPromptEqualsEachTableOnItsOwn) {
  ModelSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 4;
  spec.num_heads = 8;
  spec.head_dim = 4;
  spec.max_position = 16384;
  const int slots = static_cast<int>(kParallelSlots / (spec.num_layers * spec.num_kv_heads)) + 7;
  KvLayout layout(spec, 2);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> score(0, 40);  // coarse, so that ties are common
  for (int p = 0; p < slots; ++p) {
    for (int l = 0; l < spec.num_layers; ++l) {
      for (int h = 0; h < spec.num_kv_heads; ++h) {
        TokenMeta m;
        m.position = p;
        m.score = static_cast<float>(score(rng));
        layout.append(1, l, h, m);
      }
    }
  }
  layout.advance(1, slots);
  ASSERT_EQ(layout.retained_tokens(1), static_cast<size_t>(slots) * 8);
  ASSERT_EQ(layout.retained_tokens(0), 0u);
  EvictionPlan plan;
  plan.seq = 1;
  plan.pool_kernel = 5;
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int h = 0; h < spec.num_kv_heads; ++h) {
      SegmentEviction e;
      e.layer = l;
      e.kv_head = h;
      e.keep = slots / (2 + l + h);
      e.sinks = 4;
      e.recent_from = slots - 32 * (h + 1);
      e.pinned = {100, 2000 + 10 * h};
      plan.segments.push_back(e);
    }
  }
  std::vector<HeadTable> pooled;
  std::vector<std::vector<uint8_t>> expected;
  for (const SegmentEviction& e : plan.segments) {
    HeadTable t = layout.table(1, e.layer, e.kv_head);
    pool_scores(t, plan.pool_kernel);
    expected.push_back(select_evictions(t, e));
    pooled.push_back(std::move(t));
  }
  EXPECT_EQ(select_plan_evictions(plan, layout), expected);
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const HeadTable& t = layout.table(1, plan.segments[i].layer, plan.segments[i].kv_head);
    for (int s = 0; s < t.size(); ++s) ASSERT_EQ(t.meta[s].score, pooled[i].meta[s].score);
  }
}

}  // namespace
}  // namespace ekva
