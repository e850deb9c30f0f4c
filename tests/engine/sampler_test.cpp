#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/generate.h"

namespace ekva {
namespace {

std::vector<float> random_logits(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

// The candidates the reference way: the whole vocabulary sorted best first (higher logit, then
// lower id), cut to top-k, then to the shortest prefix whose probability reaches top-p. The cut is
// taken a little past top-p so that a sum in another order, a rounding away, cannot fall outside
// it.
std::set<int32_t> reference_candidates(const std::vector<float>& logits, const SamplingOptions& o) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  size_t keep = o.top_k > 0 ? std::min<size_t>(o.top_k, ids.size()) : ids.size();
  std::vector<double> p(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((logits[ids[i]] - logits[ids[0]]) / o.temperature);
  if (o.top_p < 1.0f) {
    double cum = 0.0;
    size_t cut = 0;
    while (cut < keep && cum < o.top_p + 1e-6) cum += p[cut++] / sum;
    keep = cut;
  }
  return {ids.begin(), ids.begin() + static_cast<ptrdiff_t>(keep)};
}

// The sampler orders only what top-k and top-p keep; whatever it draws is a candidate of the
// reference cut, and with a loose cut it draws more than one.
TEST(Sampler, DrawsOnlyFromTheTopKAndTopPCandidates) {
  const std::vector<float> logits = random_logits(32000, 7);
  for (const SamplingOptions& o :
       {SamplingOptions{0.7f, 0, 0.9f, 1}, SamplingOptions{1.0f, 50, 1.0f, 2},
        SamplingOptions{1.3f, 40, 0.5f, 3}, SamplingOptions{1.0f, 0, 0.999f, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << o.temperature << " top-k " << o.top_k << " top-p " << o.top_p);
    const std::set<int32_t> allowed = reference_candidates(logits, o);
    Sampler sampler(o);
    std::set<int32_t> drawn;
    for (int i = 0; i < 400; ++i) {
      const int32_t id = sampler.sample(logits.data(), static_cast<int>(logits.size()));
      ASSERT_TRUE(allowed.count(id) == 1) << "token " << id;
      drawn.insert(id);
    }
    EXPECT_GT(drawn.size(), 1u);
  }
}

TEST(Sampler, NarrowCutsAndGreedyTakeTheBestToken) {
  std::vector<float> logits = random_logits(5000, 11);
  logits[4321] = logits[17] = *std::max_element(logits.begin(), logits.end()) + 1.0f;  // a tie
  for (const SamplingOptions& o :
       {SamplingOptions{0.0f, 0, 1.0f, 1}, SamplingOptions{1.0f, 1, 1.0f, 2},
        SamplingOptions{1.0f, 0, 1e-6f, 3}}) {
    Sampler sampler(o);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(sampler.sample(logits.data(), 5000), 17);
  }
}

TEST(Sampler, TheSameSeedDrawsTheSameTokens) {
  const std::vector<float> logits = random_logits(32000, 13);
  const SamplingOptions o{0.9f, 0, 0.95f, 42};
  Sampler a(o), b(o);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(a.sample(logits.data(), 32000), b.sample(logits.data(), 32000));
  }
}

}  // namespace
}  // namespace ekva
