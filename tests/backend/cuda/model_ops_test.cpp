// Model operators of the CUDA backend that no model-level test reaches on their edges.
#include "backend/cuda/model_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "arch/router.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/device_buffer.h"
#include "core/error.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

// The host's greedy token of each row: the lowest id among the largest entries, or -1 - e for the
// row's first entry e that is not finite.
std::vector<int32_t> host_greedy(const std::vector<float>& logits, int rows, int vocab) {
  std::vector<int32_t> want(rows);
  for (int r = 0; r < rows; ++r) {
    const float* x = logits.data() + static_cast<size_t>(r) * vocab;
    int bad = -1, best = 0;
    for (int i = 0; i < vocab; ++i) {
      if (!std::isfinite(x[i])) {
        if (bad < 0) bad = i;
      } else if (x[i] > x[best]) {
        best = i;
      }
    }
    want[r] = bad >= 0 ? -1 - bad : best;
  }
  return want;
}

// greedy_tokens on a workspace zeroed once, called `calls` times (each leaves it for the next).
std::vector<int32_t> device_greedy(const std::vector<float>& logits, int rows, int vocab,
                                   int calls) {
  const size_t bytes = greedy_tokens_workspace(rows, vocab);
  DeviceBuffer<uint8_t> workspace(bytes);
  EKVA_CUDA_CHECK(cudaMemset(workspace.data(), 0, bytes));
  DeviceBuffer<float> logits_d{std::span<const float>(logits)};
  DeviceBuffer<int32_t> out(rows);
  std::vector<int32_t> got;
  for (int c = 0; c < calls; ++c) {
    EKVA_CUDA_CHECK(cudaMemset(out.data(), 0x7f, out.bytes()));
    greedy_tokens(logits_d.data(), rows, vocab, workspace.data(), bytes, out.data(), nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> call = out.download();
    if (c > 0) {
      EXPECT_EQ(call, got) << "call " << c;
    }
    got = call;
  }
  return got;
}

// Rows of an odd vocabulary: ties broken to the lowest id (as std::max_element does on the host)
// across the rows' chunks, a largest value at either end, and rows whose first non-finite entry
// (NaN or Inf, before or after the largest value) is reported instead of a token.
TEST(GreedyTokens, LowestIdOfTheLargestAndTheFirstNonFiniteEntry) {
  EKVA_SKIP_WITHOUT_GPU();
  constexpr int kVocab = 50'021;
  constexpr int kRows = 8;
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> value(-30.0f, 30.0f);
  std::vector<float> logits(static_cast<size_t>(kRows) * kVocab);
  for (float& x : logits) x = value(rng);
  const auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * kVocab; };
  row(0)[40'000] = 99.0f;
  row(0)[7] = 99.0f;  // the tie's lower id wins
  row(0)[45'000] = 99.0f;
  row(1)[0] = 100.0f;
  row(2)[kVocab - 1] = 100.0f;
  row(3)[123] = std::numeric_limits<float>::quiet_NaN();
  row(3)[9'000] = std::numeric_limits<float>::infinity();
  row(4)[kVocab - 1] = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < kVocab; ++i) row(5)[i] = -1.0f;       // all equal: id 0
  row(6)[30'000] = std::numeric_limits<float>::infinity();  // after the largest, in a later chunk
  row(6)[20] = 1e30f;
  const std::vector<int32_t> want = host_greedy(logits, kRows, kVocab);
  EXPECT_EQ(want[0], 7);
  EXPECT_EQ(want[3], -124);
  EXPECT_EQ(want[4], -kVocab);
  EXPECT_EQ(want[6], -30'001);
  EXPECT_EQ(device_greedy(logits, kRows, kVocab, 3), want);
}

// Vocabularies of one chunk or less, at a chunk's edges, and Qwen3's, each row's largest entry
// placed in turn at every chunk's first and last entry; a workspace too small is refused.
TEST(GreedyTokens, EveryChunkOfEveryVocabulary) {
  EKVA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-5.0f, 5.0f);
  for (const int vocab : {1, 3, 4095, 4096, 4097, 8192, 151'936}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::vector<int> places;
    for (int c = 0; c < vocab; c += 4096)
      places.insert(places.end(), {c, std::min(c + 4095, vocab - 1)});
    const int rows = static_cast<int>(places.size());
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (float& x : logits) x = value(rng);
    for (int r = 0; r < rows; ++r) logits[static_cast<size_t>(r) * vocab + places[r]] = 6.0f;
    const std::vector<int32_t> want = host_greedy(logits, rows, vocab);
    for (int r = 0; r < rows; ++r) EXPECT_EQ(want[r], places[r]);
    EXPECT_EQ(device_greedy(logits, rows, vocab, 2), want);
  }
  DeviceBuffer<uint8_t> small(16);
  EXPECT_THROW(greedy_tokens(nullptr, 2, 10, small.data(), 16, nullptr, nullptr), Error);
}

// Tokens drawn on the device are draw_token's on every row: temperatures, top-k and top-p cuts of
// every reach (none, one candidate, past the vocabulary), rows of few distinct values (ties, -0 and
// +0 among them) and a row that is not finite (its greedy error stays), at an odd vocabulary and
// at Qwen3's.
TEST(SampleTokens, EveryRowIsDrawTokens) {
  EKVA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const float temperatures[] = {0.0f, 0.3f, 1.0f, 2.5f};
  const int top_ks[] = {0, 1, 7, 100, 1 << 20};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-6f};
  for (const int vocab : {5003, 151936}) {
    const int rows = vocab == 5003 ? 80 : 6;
    SCOPED_TRACE(::testing::Message() << rows << " rows of " << vocab);
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    for (int r = 0; r < rows; ++r) {
      float* x = logits.data() + static_cast<size_t>(r) * vocab;
      for (int i = 0; i < vocab; ++i) {
        x[i] = r % 3 == 1 ? std::round(normal(rng) / 2.0f) * 0.5f : normal(rng);
        if (r % 3 == 1 && x[i] == 0.0f && i % 2 == 1) x[i] = -0.0f;
      }
    }
    logits[static_cast<size_t>(rows - 1) * vocab + 17] = std::nanf("");
    std::vector<TokenDraw> draws(rows);
    for (int r = 0; r < rows; ++r) {
      draws[r] =
          TokenDraw{temperatures[r % 4], top_ks[(r / 4) % 5], top_ps[(r / 20) % 4], uniform(rng)};
    }
    draws[rows - 1].temperature = 1.0f;
    std::vector<int32_t> want(rows);
    for (int r = 0; r < rows; ++r) {
      want[r] = draw_token(logits.data() + static_cast<size_t>(r) * vocab, vocab, draws[r]);
    }
    EXPECT_EQ(want[rows - 1], -1 - 17);
    DeviceBuffer<float> logits_d{std::span<const float>(logits)};
    DeviceBuffer<TokenDraw> draws_d{std::span<const TokenDraw>(draws)};
    const size_t bytes = sample_tokens_workspace(rows, vocab);
    DeviceBuffer<uint8_t> workspace(bytes);
    DeviceBuffer<int32_t> out(rows);
    const size_t greedy_bytes = greedy_tokens_workspace(rows, vocab);
    DeviceBuffer<uint8_t> greedy_workspace(greedy_bytes);
    EKVA_CUDA_CHECK(cudaMemset(greedy_workspace.data(), 0, greedy_bytes));
    greedy_tokens(logits_d.data(), rows, vocab, greedy_workspace.data(), greedy_bytes, out.data(),
                  nullptr);
    sample_tokens(logits_d.data(), rows, vocab, draws_d.data(), workspace.data(), bytes, out.data(),
                  nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = out.download();
    for (int r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], want[r]) << "row " << r << ": temperature " << draws[r].temperature
                                 << ", top-k " << draws[r].top_k << ", top-p " << draws[r].top_p
                                 << ", u " << draws[r].u;
    }
  }
  EXPECT_THROW(sample_tokens(nullptr, 1, 10, nullptr, nullptr, 0, nullptr, nullptr), Error);
}

// The decode step's fused router: float32 logits against double products, and the softmax's top-k
// (ties to the lower id) with gates, over calls on the same workspace (each leaves its counters at
// zero for the next); 8 and 9 experts take the dot products in 16 and 2 slices.
TEST(RouteExperts, LogitsTopKAndGatesMatchTheHost) {
  EKVA_SKIP_WITHOUT_GPU();
  struct Shape {
    int n, hidden, experts, top_k;
    bool renormalise;
  };
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  DeviceBuffer<uint32_t> workspace(kRouterWorkspaceWords);
  EKVA_CUDA_CHECK(cudaMemset(workspace.data(), 0, workspace.bytes()));
  for (const Shape c : {Shape{5, 1000, 60, 4, true}, Shape{kMaxRoutedTokens, 2048, 128, 8, false},
                        Shape{1, 4096, 8, 2, true}, Shape{3, 1000, 9, 2, false},
                        Shape{1, 2048, 128, 8, true}, Shape{1, 2048, 64, 8, false}}) {
    SCOPED_TRACE(::testing::Message() << c.n << " tokens, " << c.experts << " experts");
    std::vector<float> x(static_cast<size_t>(c.n) * c.hidden),
        w(static_cast<size_t>(c.experts) * c.hidden);
    for (float& v : x) v = value(rng);
    for (float& v : w) v = value(rng) * 0.05f;
    DeviceBuffer<float> x_d{std::span<const float>(x)}, w_d{std::span<const float>(w)};
    DeviceBuffer<float> logits_d(static_cast<size_t>(c.n) * c.experts);
    DeviceBuffer<int32_t> experts_d(static_cast<size_t>(c.n) * c.top_k);
    DeviceBuffer<float> gates_d(static_cast<size_t>(c.n) * c.top_k);
    // One token's pairs come from the router itself; they must be sort_pairs' of its picks.
    const size_t pairs = static_cast<size_t>(c.n) * c.top_k;
    DeviceBuffer<int32_t> router_ints(moe_pair_ints(pairs)), sorted_ints(moe_pair_ints(pairs));
    DeviceBuffer<float> router_gates(pairs), sorted_gates(pairs);
    const MoePairs router_pairs = moe_pairs(router_ints.data(), router_gates.data(), pairs);
    route_experts(x_d.data(), w_d.data(), c.n, c.hidden, c.experts, c.top_k, c.renormalise,
                  logits_d.data(), experts_d.data(), gates_d.data(), workspace.data(),
                  c.n == 1 ? &router_pairs : nullptr, nullptr);
    if (c.n == 1) {
      sort_pairs(experts_d.data(), gates_d.data(), 1, c.top_k, c.experts,
                 moe_pairs(sorted_ints.data(), sorted_gates.data(), pairs), nullptr);
      EKVA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(router_ints.download(), sorted_ints.download());
      EXPECT_EQ(router_gates.download(), sorted_gates.download());
    }
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> logits = logits_d.download();
    const std::vector<int32_t> experts = experts_d.download();
    const std::vector<float> gates = gates_d.download();
    for (int t = 0; t < c.n; ++t) {
      std::vector<double> want(c.experts);
      for (int e = 0; e < c.experts; ++e) {
        double dot = 0, magnitude = 0;
        for (int i = 0; i < c.hidden; ++i) {
          const double term = static_cast<double>(x[static_cast<size_t>(t) * c.hidden + i]) *
                              w[static_cast<size_t>(e) * c.hidden + i];
          dot += term;
          magnitude += std::abs(term);
        }
        want[e] = dot;
        ASSERT_NEAR(logits[static_cast<size_t>(t) * c.experts + e], dot, 1e-5 * magnitude + 1e-6);
      }
      std::vector<int> order(c.experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return want[a] > want[b]; });
      double mx = want[order[0]], sum = 0, top = 0;
      for (double l : want) sum += std::exp(l - mx);
      for (int i = 0; i < c.top_k; ++i) top += std::exp(want[order[i]] - mx) / sum;
      // A pick whose logit is within float rounding of the next one's may go either way.
      bool clear = true;
      for (int i = 0; i < c.top_k; ++i) clear = clear && want[order[i]] - want[order[i + 1]] > 1e-4;
      if (!clear) continue;
      for (int i = 0; i < c.top_k; ++i) {
        EXPECT_EQ(experts[static_cast<size_t>(t) * c.top_k + i], order[i]) << "token " << t;
        const double p = std::exp(want[order[i]] - mx) / sum;
        EXPECT_NEAR(gates[static_cast<size_t>(t) * c.top_k + i], c.renormalise ? p / top : p, 1e-5);
      }
    }
    std::vector<uint32_t> counters = workspace.download();
    counters.resize(kMaxRoutedTokens);
    EXPECT_EQ(counters, std::vector<uint32_t>(kMaxRoutedTokens, 0));
  }
  EXPECT_FALSE(route_experts_supported(kMaxRoutedTokens + 1, 1024, 64));
  EXPECT_FALSE(route_experts_supported(1, 1022, 64));
  EXPECT_FALSE(route_experts_supported(1, 1024, 32 * 8 + 1));
  EXPECT_THROW(route_experts(nullptr, nullptr, 1, 1022, 64, 2, true, nullptr, nullptr, nullptr,
                             nullptr, nullptr, nullptr),
               Error);
  const MoePairs unused;
  EXPECT_THROW(route_experts(nullptr, nullptr, 2, 1024, 64, 2, true, nullptr, nullptr, nullptr,
                             nullptr, &unused, nullptr),
               Error);
}

// Rows of 128 and 72 (QK-norm's heads, several to a CTA, the last CTA partly past the end), and
// rows of 1000 and of 5096 (past one pass of the CTA's threads) with a residual added first,
// against the CPU's norm: the same float32 products of a double sum of squares, so equal to
// rounding of that sum.
// Logits of a diverged hidden state (NaN, infinities) pick what Router::route picks: experts, never
// an index past them (which the expert products would read out of bounds).
TEST(RouteTokens, NonFiniteLogitsPickTheHostsExperts) {
  EKVA_SKIP_WITHOUT_GPU();
  static constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  static constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr int kExperts = 40, kTopK = 4;
  const std::vector<std::vector<float>> tokens = {std::vector<float>(kExperts, kNan),
                                                  [] {
                                                    std::vector<float> l(kExperts, kNan);
                                                    l[7] = 1.0f;
                                                    l[33] = 3.0f;
                                                    return l;
                                                  }(),
                                                  [] {
                                                    std::vector<float> l(kExperts, 0.5f);
                                                    l[2] = kInf;
                                                    l[5] = -kInf;
                                                    l[38] = kNan;
                                                    return l;
                                                  }()};
  std::vector<float> logits;
  for (const auto& l : tokens) logits.insert(logits.end(), l.begin(), l.end());
  const int n = static_cast<int>(tokens.size());
  DeviceBuffer<float> logits_d{std::span<const float>(logits)};
  DeviceBuffer<int32_t> experts_d(static_cast<size_t>(n) * kTopK);
  DeviceBuffer<float> gates_d(static_cast<size_t>(n) * kTopK);
  for (const bool renormalise : {false, true}) {
    route_tokens(logits_d.data(), n, kExperts, kTopK, renormalise, experts_d.data(), gates_d.data(),
                 nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> experts = experts_d.download();
    const std::vector<float> gates = gates_d.download();
    Router router(kExperts, kTopK, renormalise);
    for (int t = 0; t < n; ++t) {
      std::vector<int32_t> want_experts(kTopK);
      std::vector<float> want_gates(kTopK);
      router.route(tokens[t].data(), want_experts.data(), want_gates.data());
      for (int i = 0; i < kTopK; ++i) {
        EXPECT_EQ(experts[t * kTopK + i], want_experts[i]) << "token " << t << " pick " << i;
        EXPECT_NEAR(gates[t * kTopK + i], want_gates[i], 1e-6) << "token " << t << " pick " << i;
      }
    }
  }
}

TEST(RmsNorm, ShortRowsManyToACtaAndResidualRowsMatchTheCpu) {
  EKVA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  const auto random = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = value(rng);
    return v;
  };
  constexpr float kEps = 1e-6f;
  const int rows = 301, dim = 128, rows2 = 13, dim2 = 72;
  const std::vector<float> x = random(static_cast<size_t>(rows) * dim + rows2 * dim2);
  const std::vector<float> w = random(dim), w2 = random(dim2);
  DeviceBuffer<float> x_d{std::span<const float>(x)}, w_d{std::span<const float>(w)},
      w2_d{std::span<const float>(w2)};
  DeviceBuffer<float> inverse_d(rows + rows2);
  inverse_rms_pair(x_d.data(), rows, dim, rows2, dim2, kEps, inverse_d.data(), nullptr);
  rms_norm_pair(x_d.data(), rows, dim, w_d.data(), rows2, dim2, w2_d.data(), kEps, nullptr);
  std::vector<float> want = x;
  cpu::rms_norm(want.data(), rows, dim, w.data(), kEps);
  cpu::rms_norm(want.data() + static_cast<size_t>(rows) * dim, rows2, dim2, w2.data(), kEps);
  const std::vector<float> got = x_d.download();
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6f * std::abs(want[i]) + 1e-7f) << "element " << i;
  }
  // Each row's 1 / rms alone: the normalised row is (x * it) * weight, bit for bit (the append
  // applies a whole projection's QK-norm so).
  const std::vector<float> inverse = inverse_d.download();
  for (int r = 0; r < rows + rows2; ++r) {
    const bool second = r >= rows;
    const int row_dim = second ? dim2 : dim;
    const size_t first =
        second ? static_cast<size_t>(rows) * dim + (r - rows) * dim2 : static_cast<size_t>(r) * dim;
    for (int i = 0; i < row_dim; ++i) {
      const float w_i = second ? w2[i] : w[i];
      ASSERT_EQ(got[first + i], (x[first + i] * inverse[r]) * w_i) << "row " << r << " dim " << i;
    }
  }

  for (const auto& [n, hidden] : {std::pair{40, 1000}, std::pair{6, 5096}}) {
    SCOPED_TRACE(::testing::Message() << n << " rows of " << hidden);
    const std::vector<float> r = random(static_cast<size_t>(n) * hidden);
    const std::vector<float> delta = random(r.size()), wh = random(hidden);
    DeviceBuffer<float> r_d{std::span<const float>(r)}, delta_d{std::span<const float>(delta)},
        wh_d{std::span<const float>(wh)}, out_d(r.size());
    DeviceBuffer<uint16_t> out_bf16_d(r.size());
    add_rms_norm(r_d.data(), delta_d.data(), n, hidden, wh_d.data(), kEps, out_d.data(),
                 out_bf16_d.data(), nullptr);
    std::vector<float> sum(r.size()), normed(r.size());
    for (size_t i = 0; i < r.size(); ++i) sum[i] = r[i] + delta[i];
    cpu::rms_norm(sum.data(), normed.data(), n, hidden, wh.data(), kEps);
    const std::vector<float> got_sum = r_d.download(), got_normed = out_d.download();
    const std::vector<uint16_t> got_bf16 = out_bf16_d.download();
    for (size_t i = 0; i < r.size(); ++i) {
      ASSERT_EQ(got_sum[i], sum[i]) << "element " << i;
      ASSERT_NEAR(got_normed[i], normed[i], 1e-6f * std::abs(normed[i]) + 1e-7f) << "element " << i;
      ASSERT_EQ(got_bf16[i], f32_to_bf16(got_normed[i])) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace ekva::cuda
