#include "backend/cuda/kv_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "kv/eviction_plan.h"
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

enum class QkNormCase { kNone, kPerHead, kWholeProjection };

// With QK-norm weights, each head (or each token's whole projection, its 1 / rms found by
// inverse_rms_pair) normalised as cpu::rms_norm normalises it, then rotated. The queries are
// rotated in place, or (QK-norm cases) written as bf16 rows alone, as a prompt's tensor-core
// attention reads them.
TEST_F(KvOpsTest, AppendAppliesRopeLikeCpu) {
  using enum QkNormCase;
  for (const auto& [head_dim, norm] :
       {std::pair{64, kNone}, std::pair{128, kNone}, std::pair{128, kPerHead},
        std::pair{32, kPerHead}, std::pair{96, kPerHead}, std::pair{8, kNone},
        std::pair{128, kWholeProjection}, std::pair{96, kWholeProjection}}) {
    const bool with_norm = norm != kNone, whole = norm == kWholeProjection;
    SCOPED_TRACE(::testing::Message()
                 << "head_dim " << head_dim << " QK-norm " << static_cast<int>(norm));
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
    // The step's queries, rotated in the same launch.
    const int num_q_heads = 2 * num_kv_heads;
    std::vector<float> queries(static_cast<size_t>(count) * num_q_heads * head_dim);
    for (float& x : queries) x = value(rng);

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
    // The queries, then the keys: a step's projections as inverse_rms_pair reads them.
    std::vector<float> projections = queries;
    projections.insert(projections.end(), keys.begin(), keys.end());
    DeviceBuffer<float> projections_d{std::span<const float>(projections)},
        values_d{std::span<const float>(values)}, inv_freq_d{std::span<const float>(inv_freq)};
    float* const queries_d = projections_d.data();
    float* const keys_d = queries_d + queries.size();
    DeviceBuffer<int32_t> seq_d{std::span<const int32_t>(sequences)},
        pos_d{std::span<const int32_t>(positions)}, slots_d{std::span<const int32_t>(slots)};
    DeviceBuffer<float2> rotations_d(static_cast<size_t>(count) * (head_dim / 2));
    rope_rotations(pos_d.data(), count, inv_freq_d.data(), head_dim / 2, 1.0f, rotations_d.data(),
                   nullptr);
    KvAppend append;
    append.keys = keys_d;
    append.values = values_d.data();
    append.sequences = seq_d.data();
    append.positions = pos_d.data();
    append.slots = slots_d.data();
    append.rotations = rotations_d.data();
    append.count = count;
    append.queries = queries_d;
    append.num_q_heads = num_q_heads;
    const int q_norm_dim = whole ? num_q_heads * head_dim : head_dim;
    const int k_norm_dim = whole ? num_kv_heads * head_dim : head_dim;
    std::vector<float> q_norm(q_norm_dim), k_norm(k_norm_dim);
    std::uniform_real_distribution<float> weight(0.5f, 1.5f);
    for (float& w : q_norm) w = weight(rng);
    for (float& w : k_norm) w = weight(rng);
    constexpr float kEps = 1e-6f;
    DeviceBuffer<float> q_norm_d{std::span<const float>(q_norm)},
        k_norm_d{std::span<const float>(k_norm)};
    DeviceBuffer<uint16_t> query_rows_d(queries.size());
    DeviceBuffer<float> inverse_rms_d(2 * static_cast<size_t>(count));
    if (whole) {
      inverse_rms_pair(queries_d, count, q_norm_dim, count, k_norm_dim, kEps, inverse_rms_d.data(),
                       nullptr);
      append.projection_inverse_rms = inverse_rms_d.data();
    }
    if (with_norm) {
      append.q_norm = q_norm_d.data();
      append.k_norm = k_norm_d.data();
      append.norm_eps = kEps;
      append.queries_in_place = false;
      append.query_rows_bf16 = query_rows_d.data();
    }
    append_kv(kv.view(), append, nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());

    cpu::Rope rope(rope_spec, head_dim);
    std::vector<float> roped = keys;
    std::vector<float> roped_queries = queries;
    if (with_norm) {
      cpu::rms_norm(roped.data(), count * num_kv_heads * head_dim / k_norm_dim, k_norm_dim,
                    k_norm.data(), kEps);
      cpu::rms_norm(roped_queries.data(), count * num_q_heads * head_dim / q_norm_dim, q_norm_dim,
                    q_norm.data(), kEps);
    }
    for (int t = 0; t < count; ++t) {
      rope.apply(roped.data() + static_cast<size_t>(t) * num_kv_heads * head_dim, 1, num_kv_heads,
                 &positions[t]);
      rope.apply(roped_queries.data() + static_cast<size_t>(t) * num_q_heads * head_dim, 1,
                 num_q_heads, &positions[t]);
    }
    const std::vector<float> got_projections = projections_d.download();
    const std::vector<float> got_queries(got_projections.begin(),
                                         got_projections.begin() + queries.size());
    if (with_norm) {
      EXPECT_EQ(got_queries, queries) << "queries not wanted in place were written";
      const std::vector<uint16_t> rows = query_rows_d.download();
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_TRUE(within_one_ulp(rows[i], f32_to_bf16(roped_queries[i])))
            << "query element " << i << ": " << bf16_to_f32(rows[i]) << " against "
            << roped_queries[i];
      }
    } else {
      for (size_t i = 0; i < got_queries.size(); ++i) {
        ASSERT_NEAR(got_queries[i], roped_queries[i], 1e-3f * (1.0f + std::fabs(roped_queries[i])))
            << "query element " << i;
      }
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

// The device layer's pool rows, metadata and `lengths` (one per segment) are the host cache's
// layer 0, slot by slot (K and V rounded to bf16 as the mirror stores them).
void expect_layer_equals_cache(DeviceKvLayer& kv, const std::vector<int32_t>& lengths,
                               testing::HostKv& cache, int num_sequences, int num_kv_heads) {
  const int page_size = kv.view().page_size, head_dim = kv.view().head_dim;
  const std::vector<uint16_t> pool = kv.pool().download();
  const std::vector<TokenMeta> meta = kv.meta().download();
  for (int s = 0; s < num_sequences; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      const HeadTable& t = cache.table(s, 0, h);
      ASSERT_EQ(lengths[static_cast<size_t>(s) * num_kv_heads + h], t.size());
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

    expect_layer_equals_cache(kv, kv.lengths().download(), cache, num_sequences, num_kv_heads);
  }
}

// A decode step's evictions on the device select what the reference selects (select_evictions)
// and leave the layer as KvLayout::evict_flagged leaves it: tables up to a few slots over their
// keep, in scrambled position order, with sinks, a recent window, pinned positions and tied
// scores; where more would go than the call allows, it says so and leaves the table alone.
TEST_F(KvOpsTest, EvictDecodeEqualsTheReference) {
  const bool small = testing::small_sizes();
  std::mt19937 rng(5);
  const int num_sequences = small ? 2 : 5, num_kv_heads = 3, head_dim = 64, page_size = 16;
  constexpr int kMaxEvictions = 4;
  testing::HostKv cache(testing::kv_spec(num_kv_heads, head_dim, 4), num_sequences, page_size);
  const std::vector<int32_t> lengths =
      random_lengths(num_sequences * num_kv_heads, small ? 300 : 6000, rng);
  testing::fill_cache(cache, lengths, rng);
  for (int s = 0; s < num_sequences; ++s) {
    for (int h = 0; h < num_kv_heads; ++h) {
      std::vector<TokenMeta>& meta = cache.table(s, 0, h).meta;
      std::shuffle(meta.begin(), meta.end(), rng);  // compaction scrambles a table's order
      for (TokenMeta& m : meta) m.score = std::round(m.score * 4.0f) / 4.0f;  // many ties
    }
  }
  DeviceKvLayer kv(cache.layout, cache.pages, 0);
  // The block tables, then the lengths, in one buffer as CudaBackend keeps them.
  std::vector<int32_t> ints;
  std::vector<int32_t> table_at;
  for (int segment = 0; segment < num_sequences * num_kv_heads; ++segment) {
    const HeadTable& t = cache.table(segment / num_kv_heads, 0, segment % num_kv_heads);
    table_at.push_back(static_cast<int32_t>(ints.size()));
    ints.insert(ints.end(), t.pages.begin(), t.pages.end());
  }
  const int32_t lengths_at = static_cast<int32_t>(ints.size());
  ints.insert(ints.end(), lengths.begin(), lengths.end());
  std::vector<SegmentEviction> segments;
  std::vector<int> segment_of;
  std::vector<int32_t> params, pinned;
  for (int segment = 0; segment < num_sequences * num_kv_heads; ++segment) {
    const HeadTable& t = cache.table(segment / num_kv_heads, 0, segment % num_kv_heads);
    if (t.size() == 0) continue;
    SegmentEviction e;
    e.kv_head = segment % num_kv_heads;
    e.keep = std::max(0, t.size() - std::uniform_int_distribution<int>(0, 5)(rng));
    e.sinks = std::uniform_int_distribution<int>(0, 4)(rng);
    e.recent_from = t.size() - std::uniform_int_distribution<int>(0, 30)(rng);
    std::uniform_int_distribution<int> position(0, t.size() - 1);
    for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i)
      e.pinned.push_back(position(rng));
    std::sort(e.pinned.begin(), e.pinned.end());
    e.pinned.erase(std::unique(e.pinned.begin(), e.pinned.end()), e.pinned.end());
    params.insert(params.end(),
                  {table_at[segment], t.size(), e.keep, e.sinks, e.recent_from,
                   static_cast<int32_t>(pinned.size()),
                   static_cast<int32_t>(pinned.size() + e.pinned.size()), lengths_at + segment});
    pinned.insert(pinned.end(), e.pinned.begin(), e.pinned.end());
    segments.push_back(e);
    segment_of.push_back(segment);
  }
  pinned.push_back(0);  // never empty
  const int count = static_cast<int>(segments.size());
  DeviceBuffer<int32_t> ints_d{std::span<const int32_t>(ints)},
      params_d{std::span<const int32_t>(params)}, pinned_d{std::span<const int32_t>(pinned)},
      evicted_d{std::span<const int32_t>(std::vector<int32_t>(count * kMaxEvictions, -7))},
      counts_d{std::span<const int32_t>(std::vector<int32_t>(count, -7))};
  DecodeEvictions e;
  e.params = params_d.data();
  e.pinned = pinned_d.data();
  e.count = count;
  e.max_evictions = kMaxEvictions;
  e.evicted = evicted_d.data();
  e.num_evicted = counts_d.data();
  evict_decode(kv.pool().data(), kv.meta().data(), ints_d.data(), page_size, head_dim, e, nullptr);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> evicted = evicted_d.download(), counts = counts_d.download();
  int checked_selections = 0, refused = 0;
  std::vector<std::vector<uint8_t>> wanted(count);
  for (int i = 0; i < count; ++i) {
    const HeadTable& t = cache.table(segment_of[i] / num_kv_heads, 0, segment_of[i] % num_kv_heads);
    wanted[i] = select_evictions(t, segments[i]);
    std::vector<int32_t> want_slots;
    for (int slot = 0; slot < t.size(); ++slot) {
      if (wanted[i][slot] != 0) want_slots.push_back(slot);
    }
    SCOPED_TRACE(::testing::Message() << "segment " << segment_of[i] << " of " << t.size());
    if (static_cast<int>(want_slots.size()) > kMaxEvictions) {
      EXPECT_EQ(counts[i], -1);
      wanted[i].assign(t.size(), 0);  // left as it was
      ++refused;
      continue;
    }
    ASSERT_EQ(counts[i], static_cast<int32_t>(want_slots.size()));
    EXPECT_EQ(std::vector<int32_t>(evicted.begin() + i * kMaxEvictions,
                                   evicted.begin() + i * kMaxEvictions + counts[i]),
              want_slots);
    checked_selections += want_slots.empty() ? 0 : 1;
  }
  EXPECT_GT(checked_selections, 0);
  RecordProperty("refused", refused);
  for (int i = 0; i < count; ++i) {
    cache.evict_flagged(segment_of[i] / num_kv_heads, 0, segment_of[i] % num_kv_heads, wanted[i]);
  }
  const std::vector<int32_t> after = ints_d.download();
  expect_layer_equals_cache(kv, std::vector<int32_t>(after.begin() + lengths_at, after.end()),
                            cache, num_sequences, num_kv_heads);
}

TEST(KvOpsHostTest, RejectsBadArguments) {
  PagedKvLayer empty;
  EXPECT_THROW(append_kv(empty, KvAppend{}, nullptr), Error);
  // Refused before anything is launched, so host addresses stand in for the device's.
  uint16_t pool = 0;
  int32_t ints = 0;
  float floats = 0.0f;
  float2 rotation{};
  PagedKvLayer layer{&pool, nullptr, &ints, &ints, &ints, 1, 1, 8, 1};
  const auto expect_refusal = [&](const KvAppend& append, const std::string& needle) {
    try {
      append_kv(layer, append, nullptr);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  KvAppend one_norm;
  one_norm.keys = one_norm.values = &floats;
  one_norm.rotations = &rotation;
  one_norm.sequences = one_norm.positions = one_norm.slots = &ints;
  one_norm.count = 1;
  one_norm.queries = &floats;
  one_norm.num_q_heads = 1;
  one_norm.q_norm = &floats;
  expect_refusal(one_norm, "QK-norm needs both norm weights");
  KvAppend projection_without_weights = one_norm;
  projection_without_weights.q_norm = nullptr;
  projection_without_weights.projection_inverse_rms = &floats;
  expect_refusal(projection_without_weights, "inverse RMS needs the QK-norm weights");
  KvAppend nowhere = one_norm;
  nowhere.q_norm = nullptr;
  nowhere.queries_in_place = false;
  EXPECT_THROW(append_kv(layer, nowhere, nullptr), Error);
  // The kernel reads rows as 16-byte vectors: a row pointer off that alignment is named.
  alignas(16) float rows[8] = {};
  alignas(16) float2 rotations[4] = {};
  KvAppend misaligned;
  misaligned.keys = rows + 1;
  misaligned.values = rows;
  misaligned.rotations = rotations;
  misaligned.sequences = misaligned.positions = misaligned.slots = &ints;
  misaligned.count = 1;
  expect_refusal(misaligned, "keys must be 16-byte aligned");
  EXPECT_THROW(rope_rotations(&ints, 1, nullptr, 4, 1.0f, &rotation, nullptr), Error);
  EXPECT_THROW(evict_flagged(empty, nullptr, 16, nullptr, nullptr), Error);
  DecodeEvictions too_many;
  too_many.count = 1;
  too_many.max_evictions = kMaxDecodeEvictions + 1;
  EXPECT_THROW(evict_decode(nullptr, nullptr, nullptr, 16, 64, too_many, nullptr), Error);
  DecodeEvictions unset;
  unset.count = 1;
  unset.max_evictions = 1;
  EXPECT_THROW(evict_decode(nullptr, nullptr, nullptr, 16, 64, unset, nullptr), Error);
  DecodeEvictions odd_rows;
  odd_rows.max_evictions = 1;
  EXPECT_THROW(evict_decode(nullptr, nullptr, nullptr, 16, 60, odd_rows, nullptr), Error);
}

}  // namespace
}  // namespace ekva::cuda
