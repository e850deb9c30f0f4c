#pragma once
// Test helpers: a host KV layout and pages filled with bf16-representable random data (its device
// copy, a DeviceKvLayer, then holds exactly the same values), so that GPU results can be checked
// against the CPU backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_kv_layer.h"
#include "core/dtype.h"
#include "support/host_kv.h"

namespace ekva::cuda::testing {

using HostKv = ::ekva::testing::HostKv;

#define EKVA_SKIP_WITHOUT_GPU() \
  if (!::ekva::cuda::device_available()) GTEST_SKIP() << "no CUDA device"

// Sanitizer runs set EKVA_CUDA_TEST_SMALL=1: same code paths, sizes small enough for them.
inline bool small_sizes() {
  const char* v = std::getenv("EKVA_CUDA_TEST_SMALL");
  return v != nullptr && v[0] == '1';
}

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

inline ModelSpec kv_spec(int num_kv_heads, int head_dim, int group) {
  ModelSpec spec;
  spec.num_layers = 1;
  spec.num_kv_heads = num_kv_heads;
  spec.num_heads = num_kv_heads * group;
  spec.head_dim = head_dim;
  spec.max_position = 1 << 20;
  return spec;
}

// Appends lengths[seq * num_kv_heads + kv_head] random tokens to every segment of layer 0.
// Metadata: position = slot, a random expert in [-1, num_experts), a random score.
inline void fill_cache(HostKv& cache, const std::vector<int32_t>& lengths, std::mt19937& rng,
                       int num_experts = 8) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expert(-1, num_experts - 1);
  const int d = cache.head_dim();
  std::vector<float> k(d), v(d);
  for (int s = 0; s < cache.num_sequences(); ++s) {
    for (int h = 0; h < cache.num_kv_heads(); ++h) {
      const int length = lengths[static_cast<size_t>(s) * cache.num_kv_heads() + h];
      for (int i = 0; i < length; ++i) {
        for (int j = 0; j < d; ++j) {
          k[j] = round_bf16(value(rng));
          v[j] = round_bf16(value(rng));
        }
        TokenMeta meta;
        meta.position = i;
        meta.expert = static_cast<decltype(meta.expert)>(expert(rng));
        meta.score = value(rng);
        cache.append(s, 0, h, k.data(), v.data(), meta);
      }
    }
  }
}

}  // namespace ekva::cuda::testing
