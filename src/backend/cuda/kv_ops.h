#pragma once
// Device operations on the paged KV pool (paged_kv.h): append with RoPE, eviction by flags in
// KvLayout::evict_flagged's order, and per-group top-k selection of what to evict. Page
// allocation stays on the host: the host grows block tables before an append and releases the
// pages past the new lengths after a compaction.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/paged_kv.h"

namespace ekva::cuda {

struct KvAppend {
  const float* keys = nullptr;         // [count, num_kv_heads, head_dim], before RoPE
  const float* values = nullptr;       // [count, num_kv_heads, head_dim]
  const int32_t* sequences = nullptr;  // [count]
  const int32_t* positions = nullptr;  // [count]: the rotary position, stored in the metadata
  // [count, num_kv_heads]: destination slot of each (token, KV head); its page must already be in
  // the block table. A slot outside the table is skipped.
  const int32_t* slots = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2], scaling already applied (cpu::Rope's)
  float attention_factor = 1.0f;    // multiplies cos and sin (YaRN)
  int count = 0;
};

// Writes rotate-half-RoPE'd keys and the values as bf16, metadata {position, expert -1, score 0}
// when kv.meta is set, and raises each segment's length to cover the written slots.
void append_kv(const PagedKvLayer& kv, const KvAppend& append, cudaStream_t stream);

// Scratch the compaction needs: two ints per pool row and one per segment. Each segment uses the
// stretch of its block table's entries, so the tables must hold distinct pages of the pool.
size_t compaction_workspace_bytes(int64_t pool_rows, int num_segments);

// Evicts every slot whose pool-parallel flag is non-zero, leaving the pool, metadata and lengths
// exactly as KvLayout::evict_flagged leaves them: the survivors past the new length fill the holes
// below it, both in ascending order.
void evict_flagged(const PagedKvLayer& kv, const uint8_t* evict_flags, int64_t pool_rows,
                   void* workspace, cudaStream_t stream);

struct EvictionSelection {
  const int32_t* budgets = nullptr;       // [num_kv_heads, num_groups]: slots each group keeps
  const int32_t* expert_group = nullptr;  // [num_experts]: group of each expert; null: identity
  int num_experts = 0;
  int num_groups = 0;   // at most 64
  int sink_tokens = 0;  // slots with position < sink_tokens are always kept
  // [num_sequences]: slots with position >= this are always kept (the recent window); may be null
  const int32_t* keep_from_position = nullptr;
};

// Sets the pool-parallel flag of every retained slot: 1 to evict, 0 to keep. Within each
// (segment, expert group) the `budget` slots with the highest metadata score are kept (ties: the
// lower slot); slots whose expert maps to no group (expert -1: not routed) are kept.
void select_evictions(const PagedKvLayer& kv, const EvictionSelection& selection,
                      uint8_t* evict_flags, cudaStream_t stream);

}  // namespace ekva::cuda
