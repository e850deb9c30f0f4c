// Copies of a layout and its pages are deep: equal right after copying, independent afterwards.
#include <gtest/gtest.h>

#include "support/host_kv.h"

namespace ekva {
namespace {

using testing::HostKv;

ModelSpec two_layer_shape() {
  ModelSpec s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.num_heads = 2;
  s.head_dim = 3;
  s.max_position = 64;
  return s;
}

void fill(HostKv& cache, int tokens) {
  for (int p = 0; p < tokens; ++p) {
    for (int l = 0; l < cache.layout.num_layers(); ++l) {
      for (int h = 0; h < cache.layout.num_kv_heads(); ++h) {
        const float base = 1000.0f * l + 100.0f * h + p;
        const float key[3] = {base, base + 0.25f, base + 0.5f};
        const float value[3] = {-base, -base - 0.25f, -base - 0.5f};
        TokenMeta meta;
        meta.position = p;
        meta.expert = static_cast<int16_t>(p % 4);
        meta.score = 0.1f * p;
        cache.append(0, l, h, key, value, meta);
      }
    }
    cache.layout.advance(0, 1);
  }
}

void expect_equal(const HostKv& a, const HostKv& b) {
  ASSERT_EQ(a.layout.retained_tokens(), b.layout.retained_tokens());
  EXPECT_EQ(a.layout.kv_bytes_in_use(), b.layout.kv_bytes_in_use());
  EXPECT_EQ(a.layout.next_position(0), b.layout.next_position(0));
  for (int l = 0; l < a.layout.num_layers(); ++l) {
    for (int h = 0; h < a.layout.num_kv_heads(); ++h) {
      const HeadTable& ta = a.table(0, l, h);
      const HeadTable& tb = b.table(0, l, h);
      ASSERT_EQ(ta.size(), tb.size());
      for (int s = 0; s < ta.size(); ++s) {
        EXPECT_EQ(ta.meta[s].position, tb.meta[s].position);
        EXPECT_EQ(ta.meta[s].expert, tb.meta[s].expert);
        EXPECT_EQ(ta.meta[s].score, tb.meta[s].score);
        for (int d = 0; d < a.layout.head_dim(); ++d) {
          EXPECT_EQ(a.key(0, l, h, s)[d], b.key(0, l, h, s)[d]);
          EXPECT_EQ(a.value(0, l, h, s)[d], b.value(0, l, h, s)[d]);
        }
      }
    }
  }
}

TEST(KvCopy, HoldsTheSameTokensKeysAndValues) {
  HostKv original(two_layer_shape(), 1, /*page_size=*/4);
  fill(original, 11);  // pages partly filled
  const HostKv copy = original;
  expect_equal(original, copy);
  EXPECT_NE(original.key(0, 1, 1, 3), copy.key(0, 1, 1, 3));  // its own pages
}

TEST(KvCopy, EvictingInTheCopyLeavesTheOriginalAlone) {
  HostKv original(two_layer_shape(), 1, /*page_size=*/4);
  fill(original, 9);
  HostKv reference(two_layer_shape(), 1, 4);
  fill(reference, 9);
  HostKv copy = original;
  for (int i = 0; i < 6; ++i) copy.evict(0, 0, 1, 0);
  const float key[3] = {7, 7, 7};
  copy.append(0, 1, 0, key, key, TokenMeta{});
  EXPECT_EQ(copy.table(0, 0, 1).size(), 3);
  EXPECT_EQ(copy.table(0, 1, 0).size(), 10);
  expect_equal(original, reference);
  EXPECT_LT(copy.layout.kv_bytes_in_use(),
            original.layout.kv_bytes_in_use());  // pages released in the copy
}

TEST(KvCopy, AssignmentReplacesEverything) {
  HostKv a(two_layer_shape(), 1, 4);
  fill(a, 5);
  HostKv b(two_layer_shape(), 1, 4);
  fill(b, 13);
  b = a;
  expect_equal(a, b);
  b.layout.clear_sequence(0);
  EXPECT_EQ(b.layout.retained_tokens(), 0u);
  EXPECT_EQ(a.layout.retained_tokens(), 5u * 2 * 2);
}

}  // namespace
}  // namespace ekva
