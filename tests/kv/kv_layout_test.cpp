#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "support/host_kv.h"

namespace ekva {
namespace {

using testing::HostKv;

ModelSpec shape(int layers, int kv_heads, int head_dim) {
  ModelSpec s;
  s.num_layers = layers;
  s.num_kv_heads = kv_heads;
  s.num_heads = kv_heads;
  s.head_dim = head_dim;
  s.max_position = 4096;
  return s;
}

std::vector<float> row(int d, float v) {
  return std::vector<float>(d, v);
}

TEST(KvLayout, AppendEvictSwapRemovesAndReusesPages) {
  HostKv cache(shape(1, 1, 4), 1, /*page_size=*/4);
  for (int p = 0; p < 9; ++p) {
    TokenMeta m;
    m.position = p;
    cache.append(0, 0, 0, row(4, p).data(), row(4, 100 + p).data(), m);
  }
  EXPECT_EQ(cache.layout.pages_in_use(), 3u);  // 9 tokens in pages of 4
  cache.evict(0, 0, 0, 2);                     // the last slot (position 8) moves into slot 2
  const HeadTable& t = cache.table(0, 0, 0);
  EXPECT_EQ(t.size(), 8);
  EXPECT_EQ(t.meta[2].position, 8);
  EXPECT_EQ(cache.key(0, 0, 0, 2)[0], 8.0f);
  EXPECT_EQ(cache.value(0, 0, 0, 2)[3], 108.0f);
  EXPECT_EQ(cache.layout.pages_in_use(), 2u);  // the emptied third page went back
  TokenMeta m;
  m.position = 9;
  cache.append(0, 0, 0, row(4, 9).data(), row(4, 109).data(), m);
  EXPECT_EQ(cache.pages.pages_reserved(), 256u);  // reused from the pool, nothing new reserved
  EXPECT_EQ(cache.layout.kv_bytes_in_use(), 3 * cache.layout.page_bytes());
}

TEST(KvLayout, BytesAreRetainedTokensPlusAtMostOnePartialPagePerTable) {
  const ModelSpec s = shape(3, 2, 8);
  HostKv cache(s, 2, 16);
  std::mt19937 rng(1);
  for (int seq = 0; seq < 2; ++seq) {
    for (int l = 0; l < 3; ++l) {
      for (int h = 0; h < 2; ++h) {
        const int n = 1 + static_cast<int>(rng() % 100);
        for (int p = 0; p < n; ++p) {
          TokenMeta m;
          m.position = p;
          cache.append(seq, l, h, row(8, 1).data(), row(8, 1).data(), m);
        }
        for (int e = 0; e < n / 3; ++e)
          cache.evict(seq, l, h, static_cast<int>(rng() % cache.table(seq, l, h).size()));
      }
    }
  }
  size_t pages = 0;
  for (int seq = 0; seq < 2; ++seq)
    for (int l = 0; l < 3; ++l)
      for (int h = 0; h < 2; ++h) pages += (cache.table(seq, l, h).size() + 15) / 16;
  EXPECT_EQ(cache.layout.kv_bytes_in_use(), pages * cache.layout.page_bytes());
  const size_t token_bytes = 2 * 8 * sizeof(float);
  EXPECT_LE(cache.layout.kv_bytes_in_use(),
            cache.layout.retained_tokens() * token_bytes + 12 * 15 * token_bytes);
}

HostKv filled(int n, int page_size) {
  HostKv cache(shape(1, 1, 4), 1, page_size);
  for (int p = 0; p < n; ++p) {
    TokenMeta m;
    m.position = p;
    cache.append(0, 0, 0, row(4, p).data(), row(4, 100 + p).data(), m);
  }
  return cache;
}

TEST(KvLayout, EvictFlaggedFillsTheHolesWithTheTailSurvivorsInOrder) {
  HostKv cache = filled(10, 4);
  const std::vector<uint8_t> flags = {1, 1, 0, 1, 0, 0, 0, 0, 1, 0};
  cache.evict_flagged(0, 0, 0, flags);
  // Six are kept; the holes 0, 1 and 3 receive the survivors 6, 7 and 9 of the tail [6, 10).
  const std::vector<int32_t> expected = {6, 7, 2, 9, 4, 5};
  const HeadTable& t = cache.table(0, 0, 0);
  ASSERT_EQ(t.size(), 6);
  for (int slot = 0; slot < 6; ++slot) {
    EXPECT_EQ(t.meta[slot].position, expected[slot]);
    EXPECT_EQ(cache.key(0, 0, 0, slot)[1], static_cast<float>(expected[slot]));
    EXPECT_EQ(cache.value(0, 0, 0, slot)[3], 100.0f + static_cast<float>(expected[slot]));
  }
  EXPECT_EQ(cache.layout.pages_in_use(), 2u);
}

TEST(KvLayout, EvictFlaggedKeepsExactlyTheUnflaggedAndMovesOnlyTheTail) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 90);
    const double density = (rng() % 5) / 4.0;
    std::bernoulli_distribution flag(density);
    HostKv cache = filled(n, 1 + static_cast<int>(rng() % 7));
    std::vector<uint8_t> flags(n);
    for (auto& f : flags) f = flag(rng);
    cache.evict_flagged(0, 0, 0, flags);
    const HeadTable& t = cache.table(0, 0, 0);
    std::vector<int32_t> kept, expected;
    for (int p = 0; p < n; ++p) {
      if (flags[p] == 0) expected.push_back(p);
    }
    ASSERT_EQ(t.size(), static_cast<int>(expected.size()));
    for (int slot = 0; slot < t.size(); ++slot) {
      if (flags[slot] == 0) {
        EXPECT_EQ(t.meta[slot].position, slot);  // unflagged below kept stay
      }
      EXPECT_EQ(cache.key(0, 0, 0, slot)[0], static_cast<float>(t.meta[slot].position));
      kept.push_back(t.meta[slot].position);
    }
    std::sort(kept.begin(), kept.end());
    EXPECT_EQ(kept, expected);
    EXPECT_EQ(cache.layout.pages_in_use(),
              (expected.size() + cache.layout.page_size() - 1) / cache.layout.page_size());
  }
}

TEST(KvLayout, EvictFlaggedWithOneFlagIsEvict) {
  for (int slot = 0; slot < 9; ++slot) {
    HostKv one = filled(9, 4), flagged = filled(9, 4);
    one.evict(0, 0, 0, slot);
    std::vector<uint8_t> flags(9, 0);
    flags[slot] = 1;
    flagged.evict_flagged(0, 0, 0, flags);
    for (int s = 0; s < 8; ++s) {
      EXPECT_EQ(flagged.table(0, 0, 0).meta[s].position, one.table(0, 0, 0).meta[s].position);
    }
  }
}

TEST(KvLayout, EvictFlaggedNeedsAFlagPerSlot) {
  HostKv cache = filled(5, 4);
  const std::vector<uint8_t> flags(4, 1);
  EXPECT_THROW(cache.evict_flagged(0, 0, 0, flags), Error);
  EXPECT_EQ(cache.table(0, 0, 0).size(), 5);
}

// The slot-list form (what a device selection returns) refuses a list it cannot mean and leaves
// the table as it was.
TEST(KvLayout, EvictSlotsNeedsAscendingSlotsOfTheTable) {
  HostKv cache = filled(5, 4);
  for (const std::vector<int32_t>& slots : {std::vector<int32_t>{3, 1}, std::vector<int32_t>{2, 2},
                                            std::vector<int32_t>{5}, std::vector<int32_t>{-1}}) {
    EXPECT_THROW(cache.layout.evict_slots(0, 0, 0, slots), Error);
    EXPECT_EQ(cache.table(0, 0, 0).size(), 5);
  }
  const std::vector<int32_t> last{4};
  EXPECT_TRUE(cache.layout.evict_slots(0, 0, 0, last).empty());  // the tail goes without moves
  EXPECT_EQ(cache.table(0, 0, 0).size(), 4);
}

// What a device copy of the block tables checks before it uploads them again.
TEST(KvLayout, TableVersionChangesWithPagesNotWithSlots) {
  HostKv cache = filled(5, 4);  // two pages
  const uint64_t before = cache.layout.table_version();
  TokenMeta m;
  m.position = 5;
  cache.append(0, 0, 0, row(4, 5).data(), row(4, 105).data(), m);  // slot 5: the second page
  EXPECT_EQ(cache.layout.table_version(), before);
  const std::vector<int32_t> one{0};
  cache.layout.evict_slots(0, 0, 0, one);  // six slots to five: both pages stay
  EXPECT_EQ(cache.layout.table_version(), before);
  const std::vector<int32_t> two{0, 1};
  cache.layout.evict_slots(0, 0, 0, two);  // three slots: a page goes
  EXPECT_NE(cache.layout.table_version(), before);
}

// The tables, pages and free list of two layouts are the same.
void expect_same_layout(const KvLayout& a, const KvLayout& b) {
  ASSERT_EQ(a.pages_in_use(), b.pages_in_use());
  for (int s = 0; s < a.num_sequences(); ++s) {
    EXPECT_EQ(a.next_position(s), b.next_position(s));
    for (int l = 0; l < a.num_layers(); ++l) {
      for (int h = 0; h < a.num_kv_heads(); ++h) {
        const HeadTable &x = a.table(s, l, h), &y = b.table(s, l, h);
        EXPECT_EQ(x.pages, y.pages) << s << " " << l << " " << h;
        ASSERT_EQ(x.size(), y.size());
        for (int i = 0; i < x.size(); ++i) EXPECT_EQ(x.meta[i].position, y.meta[i].position);
      }
    }
  }
}

// A step's appends at once, with enough tables to go on all threads, take the slots and pages
// append takes token by token, also for a sequence with several tokens in the step, and when the
// pages come from the free list as well as from those never used.
TEST(KvLayout, AppendStepEqualsAppendingEachToken) {
  const ModelSpec s = shape(9, 8, 4);  // 72 tables per sequence
  KvLayout one(s, 20, KvFormat{4, DType::kF32}), step(s, 20, KvFormat{4, DType::kF32});
  std::mt19937 rng(3);
  for (int round = 0; round < 8; ++round) {
    if (round == 3) {
      for (KvLayout* layout : {&one, &step}) {
        layout->clear_sequence(4);
        layout->clear_sequence(11);
      }
    }
    std::vector<int32_t> seq, pos;
    for (int q = 0; q < 20; ++q) {
      const int tokens = round == 0 || round == 3 ? 1 + static_cast<int>(rng() % 7) : 1;
      for (int i = 0; i < tokens; ++i) {
        seq.push_back(q);
        pos.push_back(one.next_position(q) + i);
      }
    }
    if (round == 3) {  // the sequences' tokens interleaved, in no order of sequence
      std::vector<size_t> order(seq.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int32_t> shuffled_seq, shuffled_pos;
      for (const size_t i : order) {
        shuffled_seq.push_back(seq[i]);
        shuffled_pos.push_back(pos[i]);
      }
      seq = std::move(shuffled_seq);
      pos = std::move(shuffled_pos);
    }
    std::vector<int32_t> expected(static_cast<size_t>(9) * seq.size() * 8);
    for (int l = 0; l < 9; ++l) {
      for (size_t t = 0; t < seq.size(); ++t) {
        for (int h = 0; h < 8; ++h) {
          TokenMeta m;
          m.position = pos[t];
          expected[(l * seq.size() + t) * 8 + h] = one.append(seq[t], l, h, m);
        }
      }
    }
    std::vector<int32_t> slots;
    step.append_step(seq, pos, slots);
    EXPECT_EQ(slots, expected);
    for (size_t t = 0; t < seq.size(); ++t) {
      if (pos[t] + 1 > one.next_position(seq[t])) {
        one.advance(seq[t], pos[t] + 1 - one.next_position(seq[t]));
        step.advance(seq[t], pos[t] + 1 - step.next_position(seq[t]));
      }
    }
    expect_same_layout(one, step);
  }
}

// A step that runs out of pages takes none: the layout is as it was before it.
TEST(KvLayout, AppendStepThatRunsOutOfPagesLeavesNoTrace) {
  const ModelSpec s = shape(2, 2, 4);
  KvLayout layout(s, 2, KvFormat{4, DType::kF32}, /*capacity_pages=*/12);
  std::vector<int32_t> slots;
  layout.append_step({0, 1}, {0, 0}, slots);  // 8 tables, a page each; 4 pages left
  const size_t pages = layout.pages_in_use();
  const uint64_t version = layout.table_version();
  EXPECT_THROW(layout.append_step({0, 0, 0, 0, 1, 1, 1, 1}, {1, 2, 3, 4, 1, 2, 3, 4}, slots),
               Error);
  EXPECT_EQ(layout.pages_in_use(), pages);
  EXPECT_EQ(layout.table_version(), version);
  for (int q = 0; q < 2; ++q) {
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(layout.table(q, l, h).size(), 1);
        EXPECT_EQ(layout.table(q, l, h).pages.size(), 1u);
      }
    }
  }
  layout.append_step({0, 0, 0, 0}, {1, 2, 3, 4}, slots);  // the 4 pages left serve it
  EXPECT_EQ(layout.pages_in_use(), pages + 4);
}

// The mirror of many tables' device compactions leaves the slots evict_slots leaves table by table,
// and the same pages but for room for one more slot, which a table that fills its pages exactly
// keeps; a bad list is refused before any table changes.
TEST(KvLayout, MirrorEvictionsEqualsEvictSlotsPerTable) {
  const ModelSpec s = shape(8, 8, 4);
  KvLayout a(s, 20, KvFormat{4, DType::kF32}), b(s, 20, KvFormat{4, DType::kF32});
  std::mt19937 rng(5);
  for (int q = 0; q < 20; ++q) {
    std::vector<int32_t> seq(30, q), pos(30), slots;
    for (int i = 0; i < 30; ++i) pos[i] = i;
    a.append_step(seq, pos, slots);
    b.append_step(seq, pos, slots);
  }
  std::vector<std::vector<int32_t>> lists;
  std::vector<TableEviction> evictions;
  for (int q = 0; q < 20; ++q) {
    for (int l = 0; l < 8; ++l) {
      for (int h = 0; h < 8; ++h) {
        std::vector<int32_t> list;
        for (int i = 0; i < 30; ++i) {
          if (rng() % 3 == 0) list.push_back(i);
        }
        a.evict_slots(q, l, h, list);
        lists.push_back(std::move(list));
        evictions.push_back({q, l, h, nullptr, 0});
      }
    }
  }
  for (size_t i = 0; i < evictions.size(); ++i) {
    evictions[i].slots = lists[i].data();
    evictions[i].num_slots = static_cast<int>(lists[i].size());
  }
  std::vector<TableEviction> bad = evictions;
  const int32_t out_of_order[] = {2, 1};
  bad.back() = {19, 7, 7, out_of_order, 2};
  EXPECT_THROW(b.mirror_evictions(bad), Error);
  EXPECT_EQ(b.table(0, 0, 0).size(), 30);
  b.mirror_evictions(evictions);
  int exactly_full = 0;
  for (int q = 0; q < 20; ++q) {
    for (int l = 0; l < 8; ++l) {
      for (int h = 0; h < 8; ++h) {
        const HeadTable &x = a.table(q, l, h), &y = b.table(q, l, h);
        ASSERT_EQ(x.size(), y.size());
        for (int i = 0; i < x.size(); ++i) EXPECT_EQ(x.meta[i].position, y.meta[i].position);
        EXPECT_EQ(y.pages.size(), static_cast<size_t>(x.size() / 4 + 1));
        EXPECT_TRUE(std::equal(x.pages.begin(), x.pages.end(), y.pages.begin()));
        exactly_full += x.size() % 4 == 0 ? 1 : 0;
      }
    }
  }
  EXPECT_GT(exactly_full, 0);
  // The next append then takes no page.
  const size_t pages = b.pages_in_use();
  std::vector<int32_t> seq(20), pos(20), slots;
  for (int q = 0; q < 20; ++q) {
    seq[q] = q;
    pos[q] = 30;
  }
  const uint64_t version = b.table_version();
  b.append_step(seq, pos, slots);
  EXPECT_EQ(b.pages_in_use(), pages);
  EXPECT_EQ(b.table_version(), version);
}

// Attention over a ragged, evicted, unordered table equals dense softmax attention over the kept
// tokens.
TEST(KvLayout, RaggedAttentionEqualsDenseAttentionOverKeptTokens) {
  const int d = 24, kv_heads = 2, q_heads = 6, n = 77;
  const ModelSpec s = shape(1, kv_heads, d);
  HostKv cache(s, 1, 16);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int p = 0; p < n; ++p) {
    for (int h = 0; h < kv_heads; ++h) {
      std::vector<float> k(d), v(d);
      for (auto& x : k) x = normal(rng);
      for (auto& x : v) x = normal(rng);
      TokenMeta m;
      m.position = p;
      cache.append(0, 0, h, k.data(), v.data(), m);
    }
  }
  for (int h = 0; h < kv_heads; ++h) {
    for (int e = 0; e < 30; ++e)
      cache.evict(0, 0, h, static_cast<int>(rng() % cache.table(0, 0, h).size()));
  }
  std::vector<float> q(q_heads * d), out(q_heads * d);
  for (auto& x : q) x = normal(rng);
  const int32_t seq = 0, pos = n;
  cpu::attention(cache.layout, cache.pages, 0, q.data(), &seq, &pos, 1, q_heads, out.data());
  for (int h = 0; h < q_heads; ++h) {
    const int kv = h / (q_heads / kv_heads);
    const HeadTable& t = cache.table(0, 0, kv);
    std::vector<double> w(t.size());
    double mx = -1e30, sum = 0;
    for (int i = 0; i < t.size(); ++i) {
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += q[h * d + j] * cache.key(0, 0, kv, i)[j];
      w[i] = dot / std::sqrt(d);
      mx = std::max(mx, w[i]);
    }
    for (double& x : w) sum += x = std::exp(x - mx);
    for (int j = 0; j < d; ++j) {
      double want = 0;
      for (int i = 0; i < t.size(); ++i) want += w[i] / sum * cache.value(0, 0, kv, i)[j];
      EXPECT_NEAR(out[h * d + j], want, 1e-5);
    }
  }
}

}  // namespace
}  // namespace ekva
