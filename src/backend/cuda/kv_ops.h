#pragma once
// Device operations on the paged KV pool (paged_kv.h): append with RoPE, eviction by flags in
// KvLayout::evict_flagged's order, the selection of a decode step's evictions, and the scores. Page
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
  const float2* rotations = nullptr;  // [count, head_dim / 2]: rope_rotations of the positions
  int count = 0;
  // When set, the step's queries [count, num_q_heads, head_dim] are rotated in the same launch
  // (one kernel less per layer): in place when queries_in_place, and in bf16 as row query_rows[t]
  // (row t where query_rows is null) of query_rows_bf16 when that is set (the decode attention's
  // rows [sequences, num_q_heads, head_dim], or the prefill attention's). Bf16 rows alone halve
  // the bytes of queries a prompt's append writes and its attention reads.
  float* queries = nullptr;
  int num_q_heads = 0;
  bool queries_in_place = true;
  const int32_t* query_rows = nullptr;
  uint16_t* query_rows_bf16 = nullptr;
  // Per-head RMSNorm weights [head_dim] of the queries and keys (Qwen3's QK-norm), both or
  // neither: each head is normalised before its rotation as rms_norm normalises a row, in the
  // same launch.
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0.0f;
  // A norm over each token's whole query and key projections (OLMoE's QK-norm): [2 * count], the
  // queries' 1 / rms of token t at t and the keys' at count + t (inverse_rms_pair). q_norm and
  // k_norm are then [num_q_heads * head_dim] and [num_kv_heads * head_dim], each head taking its
  // slice, and norm_eps is unused.
  const float* projection_inverse_rms = nullptr;
};

// The rotary factors of a step's tokens, which every layer's append reads: rotations[t * half + i]
// = (cos, sin)(positions[t] * inv_freq[i]) * attention_factor, computed as cpu::Rope computes them
// (the angle in float32, its cosine and sine in double). Once per step: every layer and head of a
// token shares them.
void rope_rotations(const int32_t* positions, int count, const float* inv_freq, int half,
                    float attention_factor, float2* rotations, cudaStream_t stream);

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

// A decode step's evictions: segments of any layers and sequences, each as a SegmentEviction
// without group quotas describes it, selected exactly as select_evictions selects (ties included)
// when a table has outgrown its keep by at most max_evictions candidates (a decode step adds one
// slot per table), and compacted at once as KvLayout::evict_slots compacts (the survivors past the
// new length fill the holes below it, in ascending order): pool rows, metadata and length. One
// launch for the whole step, where a selection then evict_flagged took one pass over every table
// of every layer.
struct DecodeEvictions {
  // [count, 8]: the offset of the segment's block table in `ints`, its length, keep, sinks,
  // recent_from, the [begin, end) of its pinned positions (ascending) in `pinned`, and the offset
  // of its length in `ints` (lowered to what it keeps).
  const int32_t* params = nullptr;
  const int32_t* pinned = nullptr;
  int count = 0;
  int max_evictions = 0;           // at most kMaxDecodeEvictions (16)
  int32_t* evicted = nullptr;      // [count, max_evictions]: the evicted slots, ascending
  int32_t* num_evicted = nullptr;  // [count]: how many; -1 where more than max_evictions would go
                                   // (that segment is left as it was)
};
// `ints` holds the block tables and lengths (as CudaBackend uploads them: PagedKvLayer's arrays
// of every layer in one buffer); pool and meta are the layers' shared pool and its metadata.
void evict_decode(uint16_t* pool, TokenMeta* meta, int32_t* ints, int page_size, int head_dim,
                  const DecodeEvictions& evictions, cudaStream_t stream);

// The retention scores of the pool-parallel metadata: meta[r].score += delta[r] for r < rows, as
// the CPU backend adds a step's scores; a copy of some rows' scores out, and in. (Defined beside
// their kernels in kv_ops.cu: they take no shape to check.)
void add_scores(TokenMeta* meta, const float* delta, int64_t rows, cudaStream_t stream);
void gather_scores(const TokenMeta* meta, const int32_t* rows, int64_t n, float* out,
                   cudaStream_t stream);
void scatter_scores(TokenMeta* meta, const int32_t* rows, const float* scores, int64_t n,
                    cudaStream_t stream);
// Sets the pool-parallel flag of each listed row to 1.
void flag_rows(uint8_t* flags, const int32_t* rows, int64_t n, cudaStream_t stream);

}  // namespace ekva::cuda
