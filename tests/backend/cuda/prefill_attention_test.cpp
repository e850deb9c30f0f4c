// The tensor-core prefill attention against the CPU backend's attention: ragged runs of query
// tokens over ragged, paged and partly evicted segments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/model_ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

struct Case {
  int num_sequences;
  int num_kv_heads;
  int group;
  int head_dim;
  int page_size;
  int max_length;   // segment lengths drawn in [1, max_length]
  int max_queries;  // query tokens per sequence drawn in [0, max_queries]
  bool evict;       // evict about a third of the slots first: positions with gaps
  float query_scale;
};

void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int num_q_heads = c.num_kv_heads * c.group;
  std::uniform_int_distribution<int> length(1, c.max_length);
  std::vector<int32_t> lengths(static_cast<size_t>(c.num_sequences) * c.num_kv_heads);
  for (int s = 0; s < c.num_sequences; ++s) {
    // Every KV head of a sequence holds the same positions, as the engine appends them.
    const int l = length(rng);
    for (int h = 0; h < c.num_kv_heads; ++h)
      lengths[static_cast<size_t>(s) * c.num_kv_heads + h] = l;
  }
  testing::HostKv cache(testing::kv_spec(c.num_kv_heads, c.head_dim, c.group), c.num_sequences,
                        c.page_size);
  testing::fill_cache(cache, lengths, rng);
  if (c.evict) {
    std::bernoulli_distribution drop(0.3);
    for (int s = 0; s < c.num_sequences; ++s) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        std::vector<uint8_t> flags(cache.table(s, 0, h).size());
        for (uint8_t& f : flags) f = drop(rng) ? 1 : 0;
        cache.evict_flagged(s, 0, h, flags);
      }
    }
  }
  DeviceKvLayer kv(cache.layout, cache.pages, 0);

  // Each sequence's queries: a run of its last positions (as a prefill chunk after append), the
  // sequences one after another, some with none.
  std::vector<int32_t> seq, pos;
  std::uniform_int_distribution<int> queries(0, c.max_queries);
  for (int s = 0; s < c.num_sequences; ++s) {
    const int last = lengths[static_cast<size_t>(s) * c.num_kv_heads] - 1;
    const int m = std::min(queries(rng), last + 1);
    for (int i = 0; i < m; ++i) {
      seq.push_back(s);
      pos.push_back(last - m + 1 + i);
    }
  }
  const int n = static_cast<int>(seq.size());
  ASSERT_GT(n, 0);
  std::normal_distribution<float> normal(0.0f, c.query_scale);
  std::vector<float> q(static_cast<size_t>(n) * num_q_heads * c.head_dim);
  for (float& x : q) x = testing::round_bf16(normal(rng));
  std::vector<float> expected(q.size());
  cpu::attention(cache.layout, cache.pages, 0, q.data(), seq.data(), pos.data(), n, num_q_heads,
                 expected.data());

  const std::vector<int32_t> tiles = prefill_tiles(seq.data(), n);
  std::vector<uint16_t> q_bf16(q.size());
  std::transform(q.begin(), q.end(), q_bf16.begin(), f32_to_bf16);
  DeviceBuffer<uint16_t> q_device{std::span<const uint16_t>(q_bf16)};
  DeviceBuffer<int32_t> seq_device{std::span<const int32_t>(seq)};
  DeviceBuffer<int32_t> pos_device{std::span<const int32_t>(pos)};
  DeviceBuffer<int32_t> tiles_device{std::span<const int32_t>(tiles)};
  DeviceBuffer<uint16_t> out(q.size());
  EKVA_CUDA_CHECK(cudaMemset(out.data(), 0xff, out.bytes()));  // NaN: unwritten elements show
  PrefillAttention a;
  a.q = q_device.data();
  a.sequences = seq_device.data();
  a.positions = pos_device.data();
  a.tiles = tiles_device.data();
  a.num_tiles = static_cast<int>(tiles.size() / 2);
  a.out = out.data();
  a.num_q_heads = num_q_heads;
  prefill_attention(kv.view(), a, nullptr);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();

  double err2 = 0.0, ref2 = 0.0, max_ref = 0.0;
  for (float x : expected) max_ref = std::max(max_ref, std::abs(static_cast<double>(x)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "output element " << i << " not written";
    const double diff = g - expected[i];
    // P is rounded to bf16 before P.V, as in every flash-attention kernel: about 2^-8 relative.
    ASSERT_LE(std::abs(diff), 0.02 * max_ref + 1e-3)
        << "element " << i << " (token " << i / (num_q_heads * c.head_dim) << "): got " << g
        << ", CPU " << expected[i];
    err2 += diff * diff;
    ref2 += static_cast<double>(expected[i]) * expected[i];
  }
  EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 1e-2);
}

class PrefillAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { EKVA_SKIP_WITHOUT_GPU(); }
};

TEST_F(PrefillAttentionTest, RaggedRunsMatchCpu) {
  const int length = testing::small_sizes() ? 90 : 300;
  for (const Case& c : {Case{3, 2, 4, 128, 16, length, 150, false, 1.0f},
                        Case{2, 4, 1, 64, 7, length, 70, false, 1.0f},
                        Case{4, 1, 8, 32, 16, length, 130, false, 1.0f}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " group " << c.group);
    run_case(c, 11);
  }
}

TEST_F(PrefillAttentionTest, EvictedSegmentsAndPeakedSoftmax) {
  const int length = testing::small_sizes() ? 90 : 400;
  for (const Case& c : {Case{3, 2, 4, 128, 16, length, 200, true, 4.0f},
                        Case{2, 2, 2, 64, 5, length, 65, true, 4.0f}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " group " << c.group);
    run_case(c, 23);
  }
}

// Queries over a whole prompt: a tile's slots past the last one its queries see take no steps,
// found by position whether or not eviction has left the slots in position order.
TEST_F(PrefillAttentionTest, WholePromptsSkipTheSlotsATileDoesNotSee) {
  const int length = testing::small_sizes() ? 200 : 700;
  for (const Case& c : {Case{2, 2, 4, 128, 16, length, length, false, 1.0f},
                        Case{3, 2, 2, 64, 7, length, length, true, 4.0f}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << c.head_dim << " evicted " << c.evict);
    run_case(c, 37);
  }
}

TEST_F(PrefillAttentionTest, TilesCutRunsOfOneSequence) {
  const std::vector<int32_t> seq = {0, 0, 1, 1, 1, 0};
  EXPECT_EQ(prefill_tiles(seq.data(), 6), (std::vector<int32_t>{0, 2, 2, 3, 5, 1}));
  const std::vector<int32_t> long_run(kPrefillTileTokens + 3, 4);
  EXPECT_EQ(prefill_tiles(long_run.data(), static_cast<int>(long_run.size())),
            (std::vector<int32_t>{0, kPrefillTileTokens, kPrefillTileTokens, 3}));
}

TEST(PrefillAttentionDispatchTest, RejectsUnsupportedHeadDim) {
  EXPECT_FALSE(prefill_attention_supported(24));
  EXPECT_THROW(dispatch_prefill_head_dim(24, [](auto) {}), Error);
}

// The tiles are a grid dimension: more than it holds are refused before anything is launched (so
// host addresses stand in for the device's), naming the count.
TEST(PrefillAttentionDispatchTest, RejectsMoreTilesThanAGridDimensionHolds) {
  TokenMeta meta{};
  PagedKvLayer kv;
  kv.meta = &meta;
  kv.num_sequences = kv.num_kv_heads = 1;
  kv.head_dim = 128;
  PrefillAttention a;
  a.num_q_heads = 1;
  a.num_tiles = 65536;
  try {
    prefill_attention(kv, a, nullptr);
    ADD_FAILURE() << "accepted 65536 tiles";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("65536 tiles"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ekva::cuda
