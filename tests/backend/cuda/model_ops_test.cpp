// Model operators of the CUDA backend that no model-level test reaches on their edges.
#include "backend/cuda/model_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

// Rows of an odd vocabulary: ties broken to the lowest id (as std::max_element does on the host),
// a largest value at either end, and rows whose first non-finite entry (NaN or Inf, before or after
// the largest value) is reported instead of a token.
TEST(GreedyTokens, LowestIdOfTheLargestAndTheFirstNonFiniteEntry) {
  EKVA_SKIP_WITHOUT_GPU();
  constexpr int kVocab = 50'021;
  constexpr int kRows = 7;
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
  for (int i = 0; i < kVocab; ++i) row(5)[i] = -1.0f;  // all equal: id 0
  std::vector<int32_t> want(kRows);
  for (int r = 0; r < kRows; ++r) {
    const float* x = row(r);
    int bad = -1, best = 0;
    for (int i = 0; i < kVocab; ++i) {
      if (!std::isfinite(x[i])) {
        if (bad < 0) bad = i;
      } else if (x[i] > x[best]) {
        best = i;
      }
    }
    want[r] = bad >= 0 ? -1 - bad : best;
  }
  EXPECT_EQ(want[0], 7);
  EXPECT_EQ(want[3], -124);
  EXPECT_EQ(want[4], -kVocab);
  DeviceBuffer<float> logits_d{std::span<const float>(logits)};
  DeviceBuffer<int32_t> out(kRows);
  greedy_tokens(logits_d.data(), kRows, kVocab, out.data(), nullptr);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(out.download(), want);
}

}  // namespace
}  // namespace ekva::cuda
