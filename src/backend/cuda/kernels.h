#pragma once
// Launch parameters shared by the host planning code (.cpp) and the kernels (.cu). Internal to
// src/backend/cuda.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kv/kv_layout.h"

namespace ekva::cuda {

// Each CTA of the attention kernel has this many warps; a warp owns 16 tokens of every tile.
inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeTileTokens = 16 * kDecodeWarps;
// A segment's merging CTA loads its pieces' partials this many at a time, each round one more
// L2 round trip on the layer's critical path.
inline constexpr int kDecodeMergeBatch = 32;

struct DecodeLaunch {
  const uint16_t* pool;
  const int32_t* page_ids;
  const int32_t* page_offsets;
  const uint16_t* q;
  uint16_t* out;
  float* scores;  // pool-parallel, or null
  // Schedule: piece = {segment, first slot, end slot, unused} (an empty segment has one piece of
  // no slots, so that its output is written too); CTA c runs pieces
  // [cta_starts[c].w, cta_starts[c + 1].w), and cta_starts[c] also holds its first piece (one
  // dependent load less before the first K/V request); segment s's pieces are
  // [segment_piece_offsets[s], segment_piece_offsets[s + 1]); its slots start at
  // segment_token_offsets[s] in the logits scratch.
  const int4* pieces;
  const int4* cta_starts;  // [num_ctas + 1]
  const int32_t* segment_piece_offsets;
  const int32_t* segment_token_offsets;
  // [pieces * group, head_dim], bf16, each row divided by its sum. Half the bytes of float
  // partials, which the merging CTA reads alone at the end of the call.
  uint16_t* partial_o;
  float2* partial_ml;  // [pieces * group]: running max (log2 units), sum
  float* logits;       // [total tokens, group] in log2 units, or null
  // [segments], zero between runs: pieces of each segment finished so far (runs without scores).
  int32_t* segment_counters;
  int num_ctas;
  int num_segments;
  int num_q_heads;
  int num_kv_heads;
  int head_dim;
  int group;
  int page_size;
  int page_shift;    // log2(page_size) when a power of two, else -1
  float scale_log2;  // softmax scale * log2(e)
};

// Raises the kernel's shared-memory limit and returns how many CTAs fit on one multiprocessor.
int decode_attention_ctas_per_sm(int head_dim, int group);
void launch_decode_attention(const DecodeLaunch& launch, cudaStream_t stream);

struct AppendLaunch {
  uint16_t* pool;
  TokenMeta* meta;
  const int32_t* page_ids;
  const int32_t* page_offsets;
  int32_t* lengths;
  const float* keys;
  const float* values;
  const int32_t* sequences;
  const int32_t* positions;
  const int32_t* slots;
  const float2* rotations;
  int count;
  int num_kv_heads;
  int head_dim;
  int page_size;
  float* queries;  // KvAppend's
  int num_q_heads;
  bool queries_in_place;
  const int32_t* query_rows;
  uint16_t* query_rows_bf16;
  const float* q_norm;  // KvAppend's, or null
  const float* k_norm;
  float norm_eps;
  const float* projection_inverse_rms;  // KvAppend's, or null
};
void launch_append_kv(const AppendLaunch& launch, cudaStream_t stream);
void launch_rope_rotations(const int32_t* positions, int count, const float* inv_freq, int half,
                           float attention_factor, float2* rotations, cudaStream_t stream);

struct CompactLaunch {
  uint16_t* pool;
  TokenMeta* meta;
  const int32_t* page_ids;
  const int32_t* page_offsets;
  int32_t* lengths;
  const uint8_t* evict_flags;  // pool-parallel
  // Scratch of one entry per pool row; segment s's stretch starts at page_offsets[s] * page_size.
  int32_t* hole_rows;    // pool row of the rank-r flagged slot, for the holes
  int32_t* kept_rows;    // pool row of the rank-u unflagged slot, for those past the new length
  int32_t* move_counts;  // [num_segments]: holes
  int num_segments;
  int head_dim;
  int page_size;
  int copy_blocks_per_segment;
};
void launch_compact_kv(const CompactLaunch& launch, cudaStream_t stream);

// Per listed segment: offset of its block table in `ints`, length, keep, sinks, recent_from, the
// [begin, end) of its pinned positions in `pinned`, and the offset of its length in `ints`.
inline constexpr int kDecodeEvictParams = 8;
inline constexpr int kMaxDecodeEvictions = 16;
struct DecodeEvictLaunch {
  uint16_t* pool;
  TokenMeta* meta;
  int32_t* ints;          // block tables and lengths
  const int32_t* params;  // [count, kDecodeEvictParams]
  const int32_t* pinned;
  int32_t* evicted;      // [count, max_evictions]
  int32_t* num_evicted;  // [count]
  int count;
  int max_evictions;
  int page_size;
  int head_dim;
};
void launch_evict_decode(const DecodeEvictLaunch& launch, cudaStream_t stream);

}  // namespace ekva::cuda
