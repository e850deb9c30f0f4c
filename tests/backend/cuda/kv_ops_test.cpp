#include "backend/cuda/kv_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

class KvOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { EKVA_SKIP_WITHOUT_GPU(); }
};

std::vector<int32_t> random_lengths(int segments, int max_length, std::mt19937& rng) {
  std::uniform_int_distribution<int> length(0, max_length);
  std::vector<int32_t> lengths(segments);
  for (int32_t& l : lengths) l = length(rng);
  return lengths;
}

// Bits of two bf16 values differ by at most one unit in the last place.
bool within_one_ulp(uint16_t a, uint16_t b) {
  return std::abs(int(a) - int(b)) <= 1;
}

TEST_F(KvOpsTest, AppendAppliesRopeLikeCpu) {
  for (int head_dim : {64, 128}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim);
    std::mt19937 rng(7 + head_dim);
    const int num_sequences = 5, num_kv_heads = 3, page_size = 16;
    // Existing ragged content, then one new token per sequence and a 37-token chunk for sequence 2.
    testing::HostKv cache(testing::kv_spec(num_kv_heads, head_dim, 1), num_sequences, page_size);
    const std::vector<int32_t> lengths = random_lengths(num_sequences * num_kv_heads, 40, rng);
    testing::fill_cache(cache, lengths, rng);
    std::vector<int32_t> sequences = {0, 1, 2, 3, 4};
    for (int i = 0; i < 37; ++i) sequences.push_back(2);
    const int count = static_cast<int>(sequences.size());
    std::uniform_int_distribution<int> position(0, 200000);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    std::vector<int32_t> positions(count);
    for (int32_t& p : positions) p = position(rng);
    std::vector<float> keys(static_cast<size_t>(count) * num_kv_heads * head_dim);
    std::vector<float> values(keys.size());
    for (float& x : keys) x = value(rng);
    for (float& x : values) x = value(rng);

    // The host grows the tables: one empty-slot append per new token reserves pages and slots.
    std::vector<int32_t> slots(static_cast<size_t>(count) * num_kv_heads);
    const std::vector<float> zeros(head_dim, 0.0f);
    for (int t = 0; t < count; ++t) {
      for (int h = 0; h < num_kv_heads; ++h) {
        slots[static_cast<size_t>(t) * num_kv_heads + h] =
            cache.append(sequences[t], 0, h, zeros.data(), zeros.data(), TokenMeta{});
      }
    }
    DeviceKvLayer kv(cache.layout, cache.pages, 0);
    const std::vector<int32_t> old_lengths = lengths;
    kv.lengths().upload(old_lengths);

    RopeSpec rope_spec;
    rope_spec.theta = 1e6;
    std::vector<float> inv_freq(head_dim / 2);
    for (int i = 0; i < head_dim / 2; ++i) {
      inv_freq[i] = static_cast<float>(1.0 / std::pow(rope_spec.theta, 2.0 * i / head_dim));
    }
    DeviceBuffer<float> keys_d{std::span<const float>(keys)},
        values_d{std::span<const float>(values)}, inv_freq_d{std::span<const float>(inv_freq)};
    DeviceBuffer<int32_t> seq_d{std::span<const int32_t>(sequences)},
        pos_d{std::span<const int32_t>(positions)}, slots_d{std::span<const int32_t>(slots)};
    KvAppend append;
    append.keys = keys_d.data();
    append.values = values_d.data();
    append.sequences = seq_d.data();
    append.positions = pos_d.data();
    append.slots = slots_d.data();
    append.inv_freq = inv_freq_d.data();
    append.count = count;
    append_kv(kv.view(), append, nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());

    cpu::Rope rope(rope_spec, head_dim);
    std::vector<float> roped = keys;
    for (int t = 0; t < count; ++t) {
      rope.apply(roped.data() + static_cast<size_t>(t) * num_kv_heads * head_dim, 1, num_kv_heads,
                 &positions[t]);
    }
    const std::vector<uint16_t> pool = kv.pool().download();
    const std::vector<TokenMeta> meta = kv.meta().download();
    const std::vector<int32_t> new_lengths = kv.lengths().download();
    int mismatched = 0;
    for (int t = 0; t < count; ++t) {
      for (int h = 0; h < num_kv_heads; ++h) {
        const size_t th = static_cast<size_t>(t) * num_kv_heads + h;
        const HeadTable& table = cache.table(sequences[t], 0, h);
        const int slot = slots[th];
        const size_t page = table.pages[slot / page_size];
        const size_t key = (page * 2 * page_size + slot % page_size) * head_dim;
        for (int j = 0; j < head_dim; ++j) {
          const uint16_t want = f32_to_bf16(roped[th * head_dim + j]);
          ASSERT_TRUE(within_one_ulp(pool[key + j], want))
              << "token " << t << " head " << h << " dim " << j;
          mismatched += pool[key + j] != want;
          ASSERT_EQ(pool[key + static_cast<size_t>(page_size) * head_dim + j],
                    f32_to_bf16(values[th * head_dim + j]));
        }
        EXPECT_EQ(meta[page * page_size + slot % page_size].position, positions[t]);
      }
    }
    EXPECT_LT(mismatched, count * num_kv_heads * head_dim / 100) << "rounding differs too often";
    for (int s = 0; s < num_sequences; ++s) {
      for (int h = 0; h < num_kv_heads; ++h) {
        EXPECT_EQ(new_lengths[static_cast<size_t>(s) * num_kv_heads + h],
                  cache.table(s, 0, h).size());
      }
    }
  }
}

TEST_F(KvOpsTest, EvictFlaggedMatchesKvLayoutEvictFlagged) {
  const bool small = testing::small_sizes();
  // Page sizes below, at and above a warp's 32 slots; segments longer than one round of the plan
  // (8192 slots), and flag densities that leave few survivors (90%) or make few moves (5%).
  for (int page_size : {16, 5, 48}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page_size);
    std::mt19937 rng(100 + page_size);
    const int num_sequences = small ? 3 : 11, num_kv_heads = 2, head_dim = 128;
    testing::HostKv cache(testing::kv_spec(num_kv_heads, head_dim, 4), num_sequences, page_size);
    std::vector<int32_t> lengths =
        random_lengths(num_sequences * num_kv_heads, small ? 200 : 5000, rng);
    lengths[1] = 33;  // evicted whole below
    lengths[2] = 0;
    lengths[3] = small ? 9000 : 20000;
    lengths[4] = small ? 8500 : 17000;
    testing::fill_cache(cache, lengths, rng);
    DeviceKvLayer kv(cache.layout, cache.pages, 0);

    std::vector<uint8_t> flags(static_cast<size_t>(kv.pool_rows()), 0);
    for (int s = 0; s < num_sequences; ++s) {
      for (int h = 0; h < num_kv_heads; ++h) {
        const int segment = s * num_kv_heads + h;
        std::bernoulli_distribution evict(segment == 3 ? 0.9 : segment == 4 ? 0.05 : 0.4);
        HeadTable& t = cache.table(s, 0, h);
        std::vector<uint8_t> table_flags(t.size(), 0);
        for (int slot = 0; slot < t.size(); ++slot) {
          if (segment == 1 || evict(rng)) {
            flags[static_cast<size_t>(t.pages[slot / page_size]) * page_size + slot % page_size] =
                1;
            table_flags[slot] = 1;
          }
        }
        cache.evict_flagged(s, 0, h, table_flags);
      }
    }
    // The flags need not be 4-byte aligned: at page_size 48 they start one byte into the buffer.
    const size_t flag_offset = page_size == 48 ? 1 : 0;
    flags.insert(flags.begin(), flag_offset, 0);
    DeviceBuffer<uint8_t> flags_d{std::span<const uint8_t>(flags)};
    DeviceBuffer<uint8_t> workspace(
        compaction_workspace_bytes(kv.pool_rows(), kv.view().num_segments()));
    evict_flagged(kv.view(), flags_d.data() + flag_offset, kv.pool_rows(), workspace.data(),
                  nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<uint16_t> pool = kv.pool().download();
    const std::vector<TokenMeta> meta = kv.meta().download();
    const std::vector<int32_t> new_lengths = kv.lengths().download();
    for (int s = 0; s < num_sequences; ++s) {
      for (int h = 0; h < num_kv_heads; ++h) {
        const HeadTable& t = cache.table(s, 0, h);
        ASSERT_EQ(new_lengths[static_cast<size_t>(s) * num_kv_heads + h], t.size());
        for (int slot = 0; slot < t.size(); ++slot) {
          const size_t page = t.pages[slot / page_size];
          const size_t key = (page * 2 * page_size + slot % page_size) * head_dim;
          const float* k = cache.key(s, 0, h, slot);
          const float* v = cache.value(s, 0, h, slot);
          for (int j = 0; j < head_dim; ++j) {
            ASSERT_EQ(pool[key + j], f32_to_bf16(k[j])) << "seq " << s << " slot " << slot;
            ASSERT_EQ(pool[key + static_cast<size_t>(page_size) * head_dim + j], f32_to_bf16(v[j]));
          }
          const TokenMeta& m = meta[page * page_size + slot % page_size];
          EXPECT_EQ(m.position, t.meta[slot].position);
          EXPECT_EQ(m.expert, t.meta[slot].expert);
          EXPECT_EQ(m.score, t.meta[slot].score);
        }
      }
    }
  }
}

TEST_F(KvOpsTest, SelectEvictionsKeepsTopScoresPerGroup) {
  const bool small = testing::small_sizes();
  std::mt19937 rng(5);
  const int num_sequences = small ? 2 : 6, num_kv_heads = 2, head_dim = 64, page_size = 16;
  const int num_experts = 8, num_groups = 4, sink_tokens = 3;
  testing::HostKv cache(testing::kv_spec(num_kv_heads, head_dim, 4), num_sequences, page_size);
  const std::vector<int32_t> lengths =
      random_lengths(num_sequences * num_kv_heads, small ? 300 : 20000, rng);
  testing::fill_cache(cache, lengths, rng, num_experts);
  // Coarse scores: many ties, which must break toward the lower slot.
  for (int s = 0; s < num_sequences; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      for (TokenMeta& m : cache.table(s, 0, h).meta) m.score = std::round(m.score * 8.0f) / 8.0f;
    }
  }
  DeviceKvLayer kv(cache.layout, cache.pages, 0);

  const std::vector<int32_t> expert_group = {0, 0, 1, 1, 2, 2, 3, -1};  // expert 7 in no group
  std::vector<int32_t> budgets(num_kv_heads * num_groups);
  std::uniform_int_distribution<int> budget(0, small ? 60 : 3000);
  for (int32_t& b : budgets) b = budget(rng);
  std::vector<int32_t> keep_from(num_sequences);
  for (int s = 0; s < num_sequences; ++s)
    keep_from[s] = std::max(0, lengths[s * num_kv_heads] - 10);

  DeviceBuffer<int32_t> budgets_d{std::span<const int32_t>(budgets)},
      groups_d{std::span<const int32_t>(expert_group)}, keep_d{std::span<const int32_t>(keep_from)};
  DeviceBuffer<uint8_t> flags_d{std::span<const uint8_t>(std::vector<uint8_t>(kv.pool_rows(), 7))};
  EvictionSelection selection;
  selection.budgets = budgets_d.data();
  selection.expert_group = groups_d.data();
  selection.num_experts = num_experts;
  selection.num_groups = num_groups;
  selection.sink_tokens = sink_tokens;
  selection.keep_from_position = keep_d.data();
  select_evictions(kv.view(), selection, flags_d.data(), nullptr);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> flags = flags_d.download();

  for (int s = 0; s < num_sequences; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      const HeadTable& t = cache.table(s, 0, h);
      std::vector<std::vector<int>> members(num_groups);
      for (int slot = 0; slot < t.size(); ++slot) {
        const TokenMeta& m = t.meta[slot];
        if (m.position < sink_tokens || m.position >= keep_from[s] || m.expert < 0) continue;
        const int g = expert_group[m.expert];
        if (g >= 0) members[g].push_back(slot);
      }
      std::vector<uint8_t> want(t.size(), 0);
      for (int g = 0; g < num_groups; ++g) {
        std::vector<int>& v = members[g];
        std::stable_sort(v.begin(), v.end(),
                         [&](int a, int b) { return t.meta[a].score > t.meta[b].score; });
        const size_t keep = std::min<size_t>(v.size(), budgets[h * num_groups + g]);
        for (size_t i = keep; i < v.size(); ++i) want[v[i]] = 1;
      }
      for (int slot = 0; slot < t.size(); ++slot) {
        const size_t row =
            static_cast<size_t>(t.pages[slot / page_size]) * page_size + slot % page_size;
        ASSERT_EQ(flags[row], want[slot]) << "seq " << s << " head " << h << " slot " << slot;
      }
    }
  }
}

TEST(KvOpsHostTest, RejectsBadArguments) {
  PagedKvLayer empty;
  EXPECT_THROW(append_kv(empty, KvAppend{}, nullptr), Error);
  EXPECT_THROW(evict_flagged(empty, nullptr, 16, nullptr, nullptr), Error);
  EvictionSelection too_many;
  too_many.num_groups = 65;
  EXPECT_THROW(select_evictions(empty, too_many, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace ekva::cuda
