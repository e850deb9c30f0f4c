#include "backend/cuda/device_kv_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "io/model_config.h"
#include "io/repository.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

class DeviceKvLayerTest : public ::testing::Test {
 protected:
  void SetUp() override { EKVA_SKIP_WITHOUT_GPU(); }
};

// The engine's cache for the embedded model (head_dim 32, 8 query heads over 4 KV heads), one
// layer mirrored on the device: decode attention matches the CPU attention op.
TEST_F(DeviceKvLayerTest, EmbeddedModelDecodeAttentionMatchesCpu) {
  const ModelSpec spec = load_model_config(repository_path("models/ekva-moe-8m"));
  const int num_sequences = 5;
  const int layer = spec.num_layers - 1;
  std::mt19937 rng(5);
  testing::HostKv cache(spec, num_sequences);
  std::uniform_int_distribution<int> length(0, testing::small_sizes() ? 60 : 3000);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> k(spec.head_dim), v(spec.head_dim);
  for (int s = 0; s < num_sequences; ++s) {
    for (int h = 0; h < spec.num_kv_heads; ++h) {
      const int n = length(rng);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < spec.head_dim; ++j) {
          k[j] = testing::round_bf16(value(rng));
          v[j] = testing::round_bf16(value(rng));
        }
        TokenMeta meta;
        meta.position = i;
        cache.append(s, layer, h, k.data(), v.data(), meta);
      }
    }
  }
  const DeviceKvLayer kv(cache.layout, cache.pages, layer);

  const size_t elems = static_cast<size_t>(num_sequences) * spec.num_heads * spec.head_dim;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> q(elems);
  for (float& x : q) x = testing::round_bf16(normal(rng));
  std::vector<float> got(elems, std::numeric_limits<float>::quiet_NaN());
  kv.decode_attention(q, spec.num_heads, got, nullptr);

  std::vector<int32_t> seq(num_sequences), pos(num_sequences, std::numeric_limits<int>::max());
  for (int s = 0; s < num_sequences; ++s) seq[s] = s;
  std::vector<float> expected(elems);
  cpu::attention(cache.layout, cache.pages, layer, q.data(), seq.data(), pos.data(), num_sequences,
                 spec.num_heads, expected.data());
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < elems; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "element " << i;
    ASSERT_NEAR(got[i], expected[i], 0.02) << "element " << i;
    err2 += (got[i] - expected[i]) * static_cast<double>(got[i] - expected[i]);
    ref2 += static_cast<double>(expected[i]) * expected[i];
  }
  EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 1e-2);

  EXPECT_THROW(kv.decode_attention(q, spec.num_heads / 2, got, nullptr), Error);
  EXPECT_THROW(DeviceKvLayer(cache.layout, cache.pages, spec.num_layers), Error);
}

}  // namespace
}  // namespace ekva::cuda
