#include "kv/eviction_plan.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ekva
