#pragma once
// Test helpers: a KvCache filled with bf16-representable random data, and its copy in the device
// layout (same page ids, same tables), so that GPU results can be checked against the CPU backend.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/paged_kv.h"
#include "core/dtype.h"
#include "kv/kv_cache.h"

namespace ekva::cuda::testing {

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
  return spec;
}

// Appends lengths[seq * num_kv_heads + kv_head] random tokens to every segment of layer 0.
// Metadata: position = slot, a random expert in [-1, num_experts), a random score.
inline void fill_cache(KvCache& cache, const std::vector<int32_t>& lengths, std::mt19937& rng,
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

struct DevicePagedKv {
  DeviceBuffer<uint16_t> pool;
  DeviceBuffer<TokenMeta> meta;
  DeviceBuffer<int32_t> page_ids;
  DeviceBuffer<int32_t> page_offsets;
  DeviceBuffer<int32_t> lengths;
  int64_t pool_rows = 0;
  PagedKvLayer layer;
};

// Layer 0 of the cache on the device: every reserved page converted to bf16 (rows past a table's
// length hold NaN, which no operation may read), tables and metadata pool-parallel.
inline DevicePagedKv upload_cache(const KvCache& cache) {
  const int d = cache.head_dim();
  const int ps = cache.page_size();
  const size_t pages = cache.pool().pages_reserved();
  std::vector<uint16_t> pool(pages * 2 * ps * d, 0x7fc0);
  std::vector<TokenMeta> meta(pages * ps);
  std::vector<int32_t> page_ids, page_offsets = {0}, lengths;
  for (int s = 0; s < cache.num_sequences(); ++s) {
    for (int h = 0; h < cache.num_kv_heads(); ++h) {
      const HeadTable& t = cache.table(s, 0, h);
      for (int slot = 0; slot < t.size(); ++slot) {
        const int32_t page = t.pages[slot / ps];
        const size_t row = static_cast<size_t>(page) * ps + slot % ps;
        const float* k = cache.key(s, 0, h, slot);
        const float* v = cache.value(s, 0, h, slot);
        uint16_t* dst = pool.data() + (static_cast<size_t>(page) * 2 * ps + slot % ps) * d;
        for (int j = 0; j < d; ++j) {
          dst[j] = f32_to_bf16(k[j]);
          dst[static_cast<size_t>(ps) * d + j] = f32_to_bf16(v[j]);
        }
        meta[row] = t.meta[slot];
      }
      page_ids.insert(page_ids.end(), t.pages.begin(), t.pages.end());
      page_offsets.push_back(static_cast<int32_t>(page_ids.size()));
      lengths.push_back(t.size());
    }
  }
  if (page_ids.empty()) page_ids.push_back(0);
  DevicePagedKv kv{DeviceBuffer<uint16_t>(std::span<const uint16_t>(pool)),
                   DeviceBuffer<TokenMeta>(std::span<const TokenMeta>(meta)),
                   DeviceBuffer<int32_t>(std::span<const int32_t>(page_ids)),
                   DeviceBuffer<int32_t>(std::span<const int32_t>(page_offsets)),
                   DeviceBuffer<int32_t>(std::span<const int32_t>(lengths)),
                   static_cast<int64_t>(pages) * ps,
                   {}};
  kv.layer.pool = kv.pool.data();
  kv.layer.meta = kv.meta.data();
  kv.layer.page_ids = kv.page_ids.data();
  kv.layer.page_offsets = kv.page_offsets.data();
  kv.layer.lengths = kv.lengths.data();
  kv.layer.num_sequences = cache.num_sequences();
  kv.layer.num_kv_heads = cache.num_kv_heads();
  kv.layer.head_dim = d;
  kv.layer.page_size = ps;
  return kv;
}

}  // namespace ekva::cuda::testing
