#pragma once
// One layer of a KV layout and its host pages (src/kv) mirrored on the device in the paged bf16
// layout (paged_kv.h), and decode attention over it: where the engine's backend meets the CUDA
// kernels. The mirror keeps the cache's page ids, so a slot is the same (page, row) on host and
// device and pool-parallel arrays (metadata, scores, flags) line up with the host's tables.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/paged_kv.h"
#include "kv/kv_layout.h"
#include "kv/kv_pages.h"

namespace ekva::cuda {

class DeviceKvLayer {
 public:
  // Copies layer `layer`: every page the layout has handed out (rows no slot holds are NaN, so
  // that a kernel reading past a length shows in its output), block tables, lengths, metadata.
  DeviceKvLayer(const KvLayout& layout, const KvPages& pages, int layer);

  // The device view the kernels take; the KV device operations (kv_ops.h) update it in place.
  const PagedKvLayer& view() const { return view_; }
  int64_t pool_rows() const { return pool_rows_; }
  DeviceBuffer<uint16_t>& pool() { return pool_; }
  DeviceBuffer<TokenMeta>& meta() { return meta_; }
  DeviceBuffer<int32_t>& lengths() { return lengths_; }

  // Decode attention of one query token per sequence over every retained slot (as cpu::attention
  // when each query is the newest token of its sequence): q and out are host arrays
  // [num_sequences, num_q_heads, head_dim]; q is rounded to bf16 on the way in.
  void decode_attention(std::span<const float> q, int num_q_heads, std::span<float> out,
                        cudaStream_t stream) const;

 private:
  DeviceBuffer<uint16_t> pool_;
  DeviceBuffer<TokenMeta> meta_;
  DeviceBuffer<int32_t> page_ids_;
  DeviceBuffer<int32_t> page_offsets_;
  DeviceBuffer<int32_t> lengths_;
  int64_t pool_rows_ = 0;
  PagedKvLayer view_;
};

}  // namespace ekva::cuda
