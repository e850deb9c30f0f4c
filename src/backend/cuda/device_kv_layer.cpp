#include "backend/cuda/device_kv_layer.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/decode_attention.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ekva::cuda {

DeviceKvLayer::DeviceKvLayer(const KvLayout& cache, const KvPages& host, int layer) {
  if (layer < 0 || layer >= cache.num_layers()) {
    fail(ErrorKind::kInvalidArgument, "DeviceKvLayer: layer {} of a {}-layer cache", layer,
         cache.num_layers());
  }
  const int d = cache.head_dim();
  const int ps = cache.page_size();
  const size_t pages = static_cast<size_t>(cache.page_high_water());
  std::vector<float> k_row(d), v_row(d);
  std::vector<uint16_t> pool(pages * 2 * ps * d, 0x7fc0);
  std::vector<TokenMeta> meta(pages * ps);
  std::vector<int32_t> page_ids;
  std::vector<int32_t> page_offsets = {0};
  std::vector<int32_t> lengths;
  for (int s = 0; s < cache.num_sequences(); ++s) {
    for (int h = 0; h < cache.num_kv_heads(); ++h) {
      const HeadTable& t = cache.table(s, layer, h);
      for (int slot = 0; slot < t.size(); ++slot) {
        const int32_t page = t.pages[slot / ps];
        const float* k = host.key(cache.address(t, slot), k_row.data());
        const float* v = host.value(cache.address(t, slot), v_row.data());
        uint16_t* dst = pool.data() + (static_cast<size_t>(page) * 2 * ps + slot % ps) * d;
        std::transform(k, k + d, dst, f32_to_bf16);
        std::transform(v, v + d, dst + static_cast<size_t>(ps) * d, f32_to_bf16);
        meta[static_cast<size_t>(page) * ps + slot % ps] = t.meta[slot];
      }
      page_ids.insert(page_ids.end(), t.pages.begin(), t.pages.end());
      page_offsets.push_back(static_cast<int32_t>(page_ids.size()));
      lengths.push_back(t.size());
    }
  }
  if (page_ids.empty()) page_ids.push_back(0);  // a valid pointer for an empty cache
  pool_ = DeviceBuffer<uint16_t>(std::span<const uint16_t>(pool));
  meta_ = DeviceBuffer<TokenMeta>(std::span<const TokenMeta>(meta));
  page_ids_ = DeviceBuffer<int32_t>(std::span<const int32_t>(page_ids));
  page_offsets_ = DeviceBuffer<int32_t>(std::span<const int32_t>(page_offsets));
  lengths_ = DeviceBuffer<int32_t>(std::span<const int32_t>(lengths));
  pool_rows_ = static_cast<int64_t>(pages) * ps;
  view_.pool = pool_.data();
  view_.meta = meta_.data();
  view_.page_ids = page_ids_.data();
  view_.page_offsets = page_offsets_.data();
  view_.lengths = lengths_.data();
  view_.num_sequences = cache.num_sequences();
  view_.num_kv_heads = cache.num_kv_heads();
  view_.head_dim = d;
  view_.page_size = ps;
}

void DeviceKvLayer::decode_attention(std::span<const float> q, int num_q_heads,
                                     std::span<float> out, cudaStream_t stream) const {
  const size_t elems = static_cast<size_t>(view_.num_sequences) * num_q_heads * view_.head_dim;
  if (num_q_heads <= 0 || q.size() != elems || out.size() != elems) {
    fail(ErrorKind::kInvalidArgument,
         "DeviceKvLayer::decode_attention: q ({}) and out ({}) must hold {} sequences x {} query "
         "heads x head_dim {}",
         q.size(), out.size(), view_.num_sequences, num_q_heads, view_.head_dim);
  }
  const DecodeAttentionShape shape{view_.num_sequences, num_q_heads,     view_.num_kv_heads,
                                   view_.head_dim,      view_.page_size, false};
  // The lengths as the device has them: the KV device operations may have changed them.
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const DecodeAttentionPlan plan(shape, lengths_.download());
  std::vector<uint16_t> bits(elems);
  std::transform(q.begin(), q.end(), bits.begin(), f32_to_bf16);
  DeviceBuffer<uint16_t> q_device{std::span<const uint16_t>(bits)};
  DeviceBuffer<uint16_t> out_device(elems);
  DeviceBuffer<uint8_t> schedule(plan.schedule_bytes()), scratch(plan.scratch_bytes());
  plan.upload(schedule.data(), scratch.data(), stream);
  plan.run(view_, q_device.data(), out_device.data(), nullptr, schedule.data(), scratch.data(),
           stream);
  EKVA_CUDA_CHECK(cudaMemcpyAsync(bits.data(), out_device.data(), out_device.bytes(),
                                  cudaMemcpyDeviceToHost, stream));
  EKVA_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::transform(bits.begin(), bits.end(), out.begin(), bf16_to_f32);
}

}  // namespace ekva::cuda
