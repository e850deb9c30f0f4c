// cpu::attention and cpu::attention_weights against a double-precision softmax attention computed
// from the cache's rows, on ragged tables with masked (later) positions, evicted slots and GQA.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "support/host_kv.h"

namespace ekva::cpu {
namespace {

struct Case {
  int head_dim;
  int group;
  int page_size;
};

class AttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  static constexpr int kSequences = 3;
  static constexpr int kKvHeads = 2;
  static constexpr int kLayers = 2;

  AttentionTest() : cache_(spec(), kSequences, GetParam().page_size), rng_(17) {}

  ModelSpec spec() const {
    ModelSpec s;
    s.num_layers = kLayers;
    s.num_kv_heads = kKvHeads;
    s.num_heads = kKvHeads * GetParam().group;
    s.head_dim = GetParam().head_dim;
    s.max_position = 64;
    return s;
  }

  // Sequence s gets lengths {0, 1, 37}[s] tokens in every (layer, KV head) at positions 0..len-1;
  // in layer 1 every third slot is then evicted, which reorders the slots.
  void fill() {
    std::normal_distribution<float> value(0.0f, 1.0f);
    const int d = GetParam().head_dim;
    std::vector<float> k(d), v(d);
    const int lengths[kSequences] = {0, 1, 37};
    for (int s = 0; s < kSequences; ++s) {
      for (int layer = 0; layer < kLayers; ++layer) {
        for (int h = 0; h < kKvHeads; ++h) {
          for (int i = 0; i < lengths[s]; ++i) {
            for (int j = 0; j < d; ++j) {
              k[j] = value(rng_);
              v[j] = value(rng_);
            }
            TokenMeta meta;
            meta.position = i;
            cache_.append(s, layer, h, k.data(), v.data(), meta);
          }
          HeadTable& t = cache_.table(s, layer, h);
          if (layer == 1) {
            for (int slot = t.size() - 1; slot >= 0; slot -= 3) cache_.evict(s, layer, h, slot);
          }
        }
      }
    }
  }

  // Softmax weights in double of query q over the slots of `table` with position <= pos.
  std::vector<double> reference_weights(int s, int layer, int kv_head, const float* q, int pos) {
    const HeadTable& t = cache_.table(s, layer, kv_head);
    const int d = GetParam().head_dim;
    std::vector<double> w(t.size(), 0.0);
    double top = -INFINITY;
    for (int i = 0; i < t.size(); ++i) {
      if (t.meta[i].position > pos) continue;
      const float* k = cache_.key(s, layer, kv_head, i);
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += static_cast<double>(q[j]) * k[j];
      w[i] = dot / std::sqrt(static_cast<double>(d));
      top = std::max(top, w[i]);
    }
    double sum = 0;
    for (int i = 0; i < t.size(); ++i) {
      w[i] = t.meta[i].position > pos ? 0.0 : std::exp(w[i] - top);
      sum += w[i];
    }
    for (double& x : w) x = sum > 0 ? x / sum : 0.0;
    return w;
  }

  testing::HostKv cache_;
  std::mt19937 rng_;
};

TEST_P(AttentionTest, MatchesDoubleSoftmaxAttention) {
  fill();
  const int d = GetParam().head_dim;
  const int heads = kKvHeads * GetParam().group;
  // Tokens: one per sequence at the end, plus one of sequence 2 at position 20 (slots after it
  // masked) and a second of sequence 2 that may score.
  const std::vector<int32_t> seq = {0, 1, 2, 2};
  const std::vector<int32_t> pos = {0, 0, 36, 20};
  const std::vector<uint8_t> score = {0, 1, 1, 0};
  const int n = static_cast<int>(seq.size());
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n) * heads * d);
  for (float& x : q) x = value(rng_);
  for (int layer = 0; layer < kLayers; ++layer) {
    SCOPED_TRACE(::testing::Message() << "layer " << layer);
    std::vector<std::vector<float>> scores_before(kKvHeads);
    for (int h = 0; h < kKvHeads; ++h) {
      for (const TokenMeta& m : cache_.table(2, layer, h).meta) scores_before[h].push_back(m.score);
    }
    std::vector<float> out(q.size(), -1.0f);
    attention(cache_.layout, cache_.pages, layer, q.data(), seq.data(), pos.data(), n, heads,
              out.data(), score.data());
    for (int t = 0; t < n; ++t) {
      for (int qh = 0; qh < heads; ++qh) {
        const int kv = qh / GetParam().group;
        const float* qv = q.data() + (static_cast<size_t>(t) * heads + qh) * d;
        const std::vector<double> w = reference_weights(seq[t], layer, kv, qv, pos[t]);
        for (int j = 0; j < d; ++j) {
          double expected = 0;
          for (size_t i = 0; i < w.size(); ++i) {
            expected += w[i] * cache_.value(seq[t], layer, kv, static_cast<int>(i))[j];
          }
          ASSERT_NEAR(out[(static_cast<size_t>(t) * heads + qh) * d + j], expected, 2e-5)
              << "token " << t << " head " << qh << " dim " << j;
        }
      }
    }
    // Scores: sequence 2's slots gain token 2's weights summed over each group's query heads.
    for (int h = 0; h < kKvHeads; ++h) {
      std::vector<double> gained(cache_.table(2, layer, h).size(), 0.0);
      for (int qh = h * GetParam().group; qh < (h + 1) * GetParam().group; ++qh) {
        const std::vector<double> w = reference_weights(
            2, layer, h, q.data() + (2 * static_cast<size_t>(heads) + qh) * d, 36);
        for (size_t i = 0; i < w.size(); ++i) gained[i] += w[i];
      }
      const HeadTable& t = cache_.table(2, layer, h);
      for (int i = 0; i < t.size(); ++i) {
        EXPECT_NEAR(t.meta[i].score - scores_before[h][i], gained[i], 1e-5) << "slot " << i;
      }
    }
  }
}

TEST_P(AttentionTest, WeightsSumToOneOverVisibleSlotsAndZeroWithout) {
  fill();
  const int d = GetParam().head_dim;
  std::vector<float> q(d, 0.25f);
  const HeadTable& t = cache_.table(2, 1, 1);
  std::vector<float> w(t.size());
  attention_weights(cache_.pages, t, q.data(), 10, w.data());
  double sum = 0;
  for (int i = 0; i < t.size(); ++i) {
    if (t.meta[i].position > 10) {
      EXPECT_EQ(w[i], 0.0f) << "slot " << i;
    }
    EXPECT_GE(w[i], 0.0f);
    sum += w[i];
  }
  EXPECT_NEAR(sum, 1.0, 1e-6);
  attention_weights(cache_.pages, t, q.data(), -1, w.data());  // no slot is visible
  for (float x : w) EXPECT_EQ(x, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Case{32, 1, 16}, Case{64, 4, 5}, Case{128, 8, 7},
                                           Case{32, 2, 1}),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return fmt::format("d{}_g{}_p{}", p.param.head_dim, p.param.group,
                                              p.param.page_size);
                         });

}  // namespace
}  // namespace ekva::cpu
