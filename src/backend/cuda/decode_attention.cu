// Split-K decode attention over the paged KV pool (flash-decoding on a persistent, tile-balanced
// grid). Each CTA streams its tiles of 64 slots through a cp.async pipeline; each of its four warps
// takes 16 slots of a tile and runs Q·Kᵀ and P·V on the tensor cores with the group's query heads
// as the rows of a 16-row fragment, so every K/V byte is read once for the whole group. Warps keep
// their own online-softmax state and merge it in shared memory at the end of a piece. A segment
// of one piece is written out at once; otherwise the CTA that finishes the last of a segment's
// pieces merges their partials (a per-segment counter in the workspace says which CTA that is).
// Partials are stored as FlashInfer stores them, bf16 rows divided by their sums beside fp32
// maxima and sums: the merging CTA reads every partial of its segment alone, so their bytes are
// on the critical path of a call.
// With per-slot scores a second kernel merges instead: their weights need the whole segment's
// maximum before any slot is scored.
#include <cuda_bf16.h>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/kernels.h"

namespace ekva::cuda {
namespace {

constexpr int kThreads = kDecodeWarps * 32;
// Tiles of each CTA prefetched into L2 before the kernel before has finished. Per call, with 0, 1
// and 2 (one run, inputs rotated as in the full benchmark): B = 1, L = 4k 11.77, 11.65, 11.94 us;
// B = 1, L = 16k 23.8-23.9, 23.41-23.48, 23.48-23.56; B = 8, L = 4k 38.5, 37.6-37.7, 37.55.
constexpr int kPrefetchTiles = 1;

// Shared-memory layout of the K/V tiles. Measured on the H200 (Nsight Compute, L2-to-SM bytes of
// the copies): a 32-byte pool sector copied to a 32-byte-aligned shared-memory address is fetched
// from L2 once, one copied 16 bytes off alignment twice (once per 16-byte half). So rows are
// unpadded and the tiles aligned, and the 16-byte chunks of a row are permuted by the row
// (chunk ^ swizzle(row)) so that the 8 rows an ldmatrix reads hit distinct banks. Against rows
// padded by 16 bytes (every other row off alignment, 1.5x the bytes) this cut the L2 traffic by a
// third and the time by 6% at B = 32, L = 64k.
template <int D>
struct TileConfig {
  static constexpr int kRowElems = D;
  static constexpr int kTileElems = kDecodeTileTokens * kRowElems;  // K or V of one tile
  // Enough tiles in flight per multiprocessor to cover DRAM latency at two CTAs per SM.
  static constexpr int kStages = D == 128 ? 3 : 4;
  // Room to align the tiles wherever the dynamic allocation starts.
  static constexpr int kSmemBytes = kStages * 2 * kTileElems * 2 + 128;
  static constexpr int kChunksPerRow = D / 8;              // 16-byte chunks
  static constexpr int kRowsPerPass = 32 / kChunksPerRow;  // rows one warp copies per instruction
  // Where logical chunk c of row r sits: rows of 128 bytes or more permute the chunks' low three
  // bits by the row; 64-byte rows (two per 128-byte bank line) by bits 1-2 of the row.
  static __device__ __forceinline__ int chunk(int r, int c) {
    return D == 32 ? c ^ ((r >> 1) & 3) : c ^ (r & 7);
  }
};

template <int D, int G>
__global__ void __launch_bounds__(kThreads, 2) decode_attention_kernel(const DecodeLaunch p) {
  using Cfg = TileConfig<D>;
  static_assert(G <= 8, "the group's query heads are the low 8 rows of a 16-row fragment");
  extern __shared__ __align__(16) uint16_t smem[];
  const uint32_t smem_base = (shared_address(smem) + 127) & ~127u;
  uint16_t* const tiles = smem + (smem_base - shared_address(smem)) / 2;

  const int4 cta_start = p.cta_starts[blockIdx.x];
  const int piece_begin = cta_start.w;
  const int piece_end = p.cta_starts[blockIdx.x + 1].w;
  if (piece_begin >= piece_end) return;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row_g = lane / 4;  // fragment row: the query head of the group
  const int quad = lane % 4;
  const int ps = p.page_size;
  // Loader: the cursor names the tile after the one whose page ids are held in registers. The ids
  // of a tile are fetched one issue ahead, so their latency hides behind a tile of compute.
  // Each warp copies its own 16 rows of every tile, so a warp waits for its data alone (no CTA
  // barrier) and the warps drift apart, which keeps the requests in flight more even.
  constexpr int kRowsPerThread = 16 / Cfg::kRowsPerPass;
  const int load_chunk = lane % Cfg::kChunksPerRow;
  const int load_row0 = warp * 16 + lane / Cfg::kChunksPerRow;
  const auto page_index = [&](int slot) {
    return p.page_shift >= 0 ? slot >> p.page_shift : slot / ps;
  };
  int load_piece = piece_begin;
  int4 load_info = cta_start;
  int load_start = load_info.y;
  const int32_t* load_table = p.page_ids + p.page_offsets[load_info.x];
  bool held = false;
  int held_start = 0;
  int held_end = 0;
  int held_ids[kRowsPerThread];

  const auto fetch_ids = [&]() {
    held = load_piece < piece_end;
    if (!held) return;
    held_start = load_start;
    held_end = load_info.z;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int slot = held_start + load_row0 + i * Cfg::kRowsPerPass;
      held_ids[i] = slot < held_end ? load_table[page_index(slot)] : 0;
    }
    load_start += kDecodeTileTokens;
    if (load_start >= load_info.z && ++load_piece < piece_end) {
      load_info = p.pieces[load_piece];
      load_start = load_info.y;
      load_table = p.page_ids + p.page_offsets[load_info.x];
    }
  };

  const auto issue_tile = [&](int stage) {
    if (held) {
      // K/V are read once per step: they should not push out of L2 what is read again (block
      // tables, partials, the other layers' queries).
      const uint64_t stream_policy = evict_first_policy();
      const uint32_t k_dst = smem_base + stage * 2 * Cfg::kTileElems * 2;
      const uint32_t v_dst = k_dst + Cfg::kTileElems * 2;
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const int r = load_row0 + i * Cfg::kRowsPerPass;
        const int slot = held_start + r;
        const bool valid = slot < held_end;
        const int row = slot - page_index(slot) * ps;
        const uint16_t* k_src =
            valid ? p.pool + (static_cast<int64_t>(held_ids[i]) * 2 * ps + row) * D + load_chunk * 8
                  : p.pool;
        const uint32_t offset = (r * Cfg::kRowElems + Cfg::chunk(r, load_chunk) * 8) * 2;
        cp_async_16(k_dst + offset, k_src, valid, stream_policy);
        cp_async_16(v_dst + offset, valid ? k_src + static_cast<int64_t>(ps) * D : p.pool, valid,
                    stream_policy);
      }
    }
    cp_async_commit();
    fetch_ids();
  };

  // Compute cursor and the warp's online-softmax state for the current piece.
  int piece = piece_begin;
  int4 info = cta_start;
  int4 next_info = info;  // fetched a piece ahead
  int tile_start = info.y;
  int segment_first = 0;  // the segment's pieces, fetched at the start of the piece
  int segment_count = 0;
  uint32_t q_frag[D / 16][2];
  float o[D / 8][4];
  float row_max = -INFINITY;
  float row_sum = 0.0f;
  int64_t logit_base = 0;

  const auto begin_piece = [&]() {
    const int seq = info.x / p.num_kv_heads;
    const int kv_head = info.x - seq * p.num_kv_heads;
    const uint16_t* qh =
        p.q + (static_cast<int64_t>(seq) * p.num_q_heads + kv_head * G + row_g) * D + quad * 2;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      q_frag[kk][0] = row_g < G ? *reinterpret_cast<const uint32_t*>(qh + kk * 16) : 0u;
      q_frag[kk][1] = row_g < G ? *reinterpret_cast<const uint32_t*>(qh + kk * 16 + 8) : 0u;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    row_max = -INFINITY;
    row_sum = 0.0f;
    if (p.logits != nullptr) logit_base = p.segment_token_offsets[info.x];
    segment_first = p.segment_piece_offsets[info.x];
    segment_count = p.segment_piece_offsets[info.x + 1] - segment_first;
    if (piece + 1 < piece_end) next_info = p.pieces[piece + 1];
  };

  // Normalised output elements 4c..4c+3 (head 4c / D) of segment `segment`, in one store.
  const auto write_out = [&](int segment, int c, float4 value) {
    const int seq = segment / p.num_kv_heads;
    const int kv_head = segment - seq * p.num_kv_heads;
    const uint2 packed = make_uint2(pack_bf16(value.x, value.y), pack_bf16(value.z, value.w));
    reinterpret_cast<uint2*>(p.out + (static_cast<int64_t>(seq) * p.num_q_heads + kv_head * G) *
                                         D)[c] = packed;
  };

  // A warp's state at a piece's end goes to its own rows of the stage it has just used, which it
  // alone fills and refills only at its next tile: the four warps merge after one barrier, where
  // three warps' shared-memory atomics on the same addresses kept a piece's end waiting. Output
  // dims are permuted by the head so that the heads' stores fall in different banks.
  static_assert(G * D * sizeof(float) <= 16 * D * sizeof(uint16_t),
                "a warp's output state fits in its K rows of a stage");
  const auto warp_state = [&](int done_stage, int w) {
    return reinterpret_cast<float*>(tiles + done_stage * 2 * Cfg::kTileElems + w * 16 * D);
  };
  const auto state_column = [](int head, int d) {
    return head * D + ((d / 8) ^ head) % (D / 8) * 8 + d % 8;
  };

  const auto end_piece = [&](int done_stage) {
    float sum = row_sum;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    __syncwarp();  // every lane's ldmatrix of the rows the state overwrites has completed
    if (row_g < G) {
      float* state = warp_state(done_stage, warp);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        *reinterpret_cast<float2*>(state + state_column(row_g, n * 8 + quad * 2)) =
            make_float2(o[n][0], o[n][1]);
      }
      // The maxima and sums after the outputs, in the warp's V rows of the stage.
      if (quad == 0) {
        reinterpret_cast<float2*>(state + Cfg::kTileElems / 2)[row_g] = make_float2(row_max, sum);
      }
    }
    __syncthreads();

    const int segment = info.x;
    const int first = segment_first;
    const int count = segment_count;
    constexpr int kColumns = G * D / 4;  // 4-float columns of the group's output
    const bool direct = count == 1 && p.scores == nullptr;
    for (int c = threadIdx.x; c < kColumns; c += kThreads) {
      const int head = c * 4 / D;
      const int d = c * 4 - head * D;
      float2 ml[kDecodeWarps];
      float cta_max = -INFINITY;
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        ml[w] =
            reinterpret_cast<const float2*>(warp_state(done_stage, w) + Cfg::kTileElems / 2)[head];
        cta_max = fmaxf(cta_max, ml[w].x);
      }
      float l = 0.0f;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        // A warp that saw no slot of the piece (maximum -inf) adds nothing.
        const float scale = ml[w].x == -INFINITY ? 0.0f : exp2f(ml[w].x - cta_max);
        const float4 v =
            *reinterpret_cast<const float4*>(warp_state(done_stage, w) + state_column(head, d));
        l += ml[w].y * scale;
        acc.x += v.x * scale;
        acc.y += v.y * scale;
        acc.z += v.z * scale;
        acc.w += v.w * scale;
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float4 value = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (direct) {
        write_out(segment, c, value);
      } else {
        reinterpret_cast<uint2*>(p.partial_o + static_cast<int64_t>(piece) * G * D)[c] =
            make_uint2(pack_bf16(value.x, value.y), pack_bf16(value.z, value.w));
        if (d == 0) p.partial_ml[piece * G + head] = make_float2(cta_max, l);
      }
    }
    // The stage is refilled at the next tile; every warp has read the others' rows by then.
    __syncthreads();
    if (direct || p.scores != nullptr) return;  // written out, or the reduction kernel merges

    // The last CTA to finish a piece of the segment merges them all; it then resets the counter
    // for the next run. One thread's acquire-release count orders the whole CTA's partials before
    // it and the other CTAs' partials before the merge (128 fences in its place cost 0.3 us at
    // B = 1, L = 16k).
    const bool last = threadIdx.x == 0 && count_in(p.segment_counters + segment) == count - 1;
    if (!__syncthreads_or(last)) return;
    // Other CTAs wrote the partials during this launch: read them from L2, never from L1. A
    // thread per 4-float column of the group's output loads kBatch pieces before using any, then
    // folds them into its running maximum, sum and column. The lanes whose columns share a head
    // load that head's maxima and sums once between them and pass each piece's weight round by
    // shuffles, so a round's registers go to the columns: 32 pieces (a segment of B = 1, L = 16k)
    // in one round. The merge stays here, in the loop: moved after it, ptxas 13.0 miscompiles the
    // K/V copies (tools/check_ldgsts_registers.py).
    constexpr int kBatch = kDecodeMergeBatch;
    constexpr int kHeadLanes = D / 4 < 32 ? D / 4 : 32;  // aligned lanes of a warp, one head
    constexpr int kOwnPieces = kBatch / kHeadLanes;      // maxima and sums each lane loads
    static_assert(kBatch % kHeadLanes == 0, "each piece's weight comes from one lane");
    const int head_lane0 = lane & ~(kHeadLanes - 1);
    const int head_rank = lane - head_lane0;
    for (int c0 = 0; c0 < kColumns && c0 + warp * 32 < kColumns; c0 += kThreads) {
      // Lanes past the last column (fewer than 32 columns) make up whole heads of their own.
      const int c = c0 + threadIdx.x;
      const bool valid = c < kColumns;
      const int head = c * 4 / D;
      float m = -INFINITY;
      float l = 0.0f;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int j0 = first; j0 < first + count; j0 += kBatch) {
        float2 own[kOwnPieces];
        uint2 v[kBatch];
#pragma unroll
        for (int t = 0; t < kOwnPieces; ++t) {
          const int j = j0 + t * kHeadLanes + head_rank;
          own[t] = valid && j < first + count ? __ldcg(&p.partial_ml[j * G + head])
                                              : make_float2(-INFINITY, 0.0f);
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int j = j0 + i;
          v[i] = valid && j < first + count
                     ? __ldcg(reinterpret_cast<const uint2*>(p.partial_o +
                                                             static_cast<int64_t>(j) * G * D) +
                              c)
                     : make_uint2(0u, 0u);
        }
        float top = m;
#pragma unroll
        for (int t = 0; t < kOwnPieces; ++t) top = fmaxf(top, own[t].x);
#pragma unroll
        for (int o = kHeadLanes / 2; o > 0; o /= 2) {
          top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
        }
        const float ref = top == -INFINITY ? 0.0f : top;  // nothing seen yet: no NaN
        const float rescale = exp2f(m - ref);
        l *= rescale;
        acc.x *= rescale;
        acc.y *= rescale;
        acc.z *= rescale;
        acc.w *= rescale;
        float own_weight[kOwnPieces];
#pragma unroll
        for (int t = 0; t < kOwnPieces; ++t) own_weight[t] = exp2f(own[t].x - ref) * own[t].y;
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const float weight =
              __shfl_sync(0xffffffffu, own_weight[i / kHeadLanes], head_lane0 + i % kHeadLanes);
          const float2 lo = unpack_bf16(v[i].x);
          const float2 hi = unpack_bf16(v[i].y);
          l += weight;
          acc.x += weight * lo.x;
          acc.y += weight * lo.y;
          acc.z += weight * hi.x;
          acc.w += weight * hi.y;
        }
        m = top;
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if (valid) {
        write_out(segment, c, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
      }
    }
    if (threadIdx.x == 0) p.segment_counters[segment] = 0;
  };

  // Only the schedule and the block tables, which the host writes, are read before the kernel
  // before this one has finished: it may be writing q and the pool (the appended token), or
  // reading this plan's partials and counters (the previous run).
  fetch_ids();
  // The first tile's pages start on their way from DRAM into L2 while the kernel before finishes
  // (at B = 1, L = 16k the 2.5 us of its merge tail leave DRAM idle). L2 is where every write
  // meets, so what that kernel writes is never read stale; at worst a line is fetched twice.
  {
    int4 ahead = cta_start;
    int tiles_left = kPrefetchTiles;
    for (int k = piece_begin;;) {
      const int tiles =
          min(tiles_left, (ahead.z - ahead.y + kDecodeTileTokens - 1) / kDecodeTileTokens);
      if (tiles > 0) {
        const int first_page = page_index(ahead.y);
        const int pages =
            page_index(min(ahead.z, ahead.y + tiles * kDecodeTileTokens) - 1) - first_page + 1;
        const int32_t* table = p.page_ids + p.page_offsets[ahead.x];
        for (int i = threadIdx.x; i < pages; i += kThreads) {
          prefetch_l2(p.pool + static_cast<int64_t>(table[first_page + i]) * 2 * ps * D,
                      2 * ps * D * sizeof(uint16_t));
        }
        tiles_left -= tiles;
      }
      if (tiles_left == 0 || ++k == piece_end) break;
      ahead = p.pieces[k];
    }
  }
  wait_for_prior_grid();
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) issue_tile(s);
  begin_piece();
  // The next kernel may start on the multiprocessors this grid frees once every CTA's first
  // copies are on their way: started with this one, its weight loads slowed the schedule and
  // block-table lookups before the wait (some CTAs began their copies 4 us after it). It waits
  // for this one to finish before it touches anything this one touches.
  allow_next_grid();

  int stage = 0;
  while (piece < piece_end) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncwarp();  // the warp's rows have landed for all its lanes; the stage refilled next is free
    issue_tile((stage + Cfg::kStages - 1) % Cfg::kStages);

    const uint32_t k_tile = smem_base + stage * 2 * Cfg::kTileElems * 2;
    const uint32_t v_tile = k_tile + Cfg::kTileElems * 2;

    // S[head, slot] for the warp's 16 slots: two 8-slot fragments.
    float s[2][4] = {};
    {
      const int row = warp * 16 + (lane & 7) + ((lane >> 4) << 3);
      const int col = ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + (row * Cfg::kRowElems + Cfg::chunk(row, kk * 2 + col / 8) * 8) * 2);
        const uint32_t a[4] = {q_frag[kk][0], 0u, q_frag[kk][1], 0u};
        mma_bf16_16816(s[0], a, b[0], b[1]);
        mma_bf16_16816(s[1], a, b[2], b[3]);
      }
    }

    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int slot = tile_start + warp * 16 + j * 8 + quad * 2 + e;
        s[j][e] = slot < info.z ? s[j][e] * p.scale_log2 : -INFINITY;
        tile_max = fmaxf(tile_max, s[j][e]);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float new_max = fmaxf(row_max, tile_max);
    const float ref = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: no NaN
    const float rescale = exp2f(row_max - ref);
    row_max = new_max;
    float prob[2][2];
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        prob[j][e] = exp2f(s[j][e] - ref);
        tile_sum += prob[j][e];
      }
    }
    row_sum = row_sum * rescale + tile_sum;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= rescale;
      o[n][1] *= rescale;
    }
    if (p.logits != nullptr && row_g < G) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int slot = tile_start + warp * 16 + j * 8 + quad * 2 + e;
          if (slot < info.z) p.logits[(logit_base + slot) * G + row_g] = s[j][e];
        }
      }
    }

    // O[head, dim] += P[head, slot] · V[slot, dim]; P rows 8..15 are the padding heads (zero).
    {
      const uint32_t a[4] = {pack_bf16(prob[0][0], prob[0][1]), 0u,
                             pack_bf16(prob[1][0], prob[1][1]), 0u};
      const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int col = (lane >> 4) * 8;
#pragma unroll
      for (int nn = 0; nn < D / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, v_tile + (row * Cfg::kRowElems + Cfg::chunk(row, nn * 2 + col / 8) * 8) * 2);
        mma_bf16_16816(o[2 * nn], a, b[0], b[1]);
        mma_bf16_16816(o[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // Taken before the increment: derived after it, ptxas 13.0 miscompiled the K/V copies
    // (tools/check_ldgsts_registers.py).
    const int done_stage = stage;
    stage = (stage + 1) % Cfg::kStages;
    tile_start += kDecodeTileTokens;
    if (tile_start >= info.z) {
      end_piece(done_stage);
      if (++piece < piece_end) {
        info = next_info;
        tile_start = info.y;
        begin_piece();
      }
    }
  }
  cp_async_wait_all();
}

constexpr int kReduceWarps = 8;

// With per-slot scores. Grid (segment, head of the group): merges the partials of the segment's
// pieces (a warp per partial at a time, a lane per 32nd of the head), writes the normalised output
// and the per-slot weights summed over the group (slots shared among the group's CTAs).
template <int D, int G>
__global__ void __launch_bounds__(kReduceWarps * 32) decode_reduce_kernel(const DecodeLaunch p) {
  __shared__ float head_max[G];
  __shared__ float head_inv_sum[G];
  __shared__ float warp_acc[kReduceWarps][D];
  const int segment = blockIdx.x;
  const int head = blockIdx.y;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int seq = segment / p.num_kv_heads;
  const int kv_head = segment - seq * p.num_kv_heads;
  const int first = p.segment_piece_offsets[segment];
  const int last = p.segment_piece_offsets[segment + 1];

  if (warp < G) {
    float m = -INFINITY;
    for (int j = first + lane; j < last; j += 32) m = fmaxf(m, p.partial_ml[j * G + warp].x);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
    if (m != -INFINITY) {
      for (int j = first + lane; j < last; j += 32) {
        const float2 ml = p.partial_ml[j * G + warp];
        sum += exp2f(ml.x - m) * ml.y;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      head_max[warp] = m;
      head_inv_sum[warp] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
  }
  __syncthreads();

  const float m = head_max[head];
  float acc[D / 32] = {};
  if (m != -INFINITY) {
#pragma unroll 4
    for (int j = first + warp; j < last; j += kReduceWarps) {
      const int64_t index = static_cast<int64_t>(j) * G + head;
      const float2 ml = p.partial_ml[index];
      const float weight = exp2f(ml.x - m) * ml.y;
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        acc[i] += weight * bf16_bits_to_float(p.partial_o[index * D + i * 32 + lane]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < D / 32; ++i) warp_acc[warp][i * 32 + lane] = acc[i];
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kReduceWarps; ++w) total += warp_acc[w][d];
    const int64_t out_index =
        (static_cast<int64_t>(seq) * p.num_q_heads + kv_head * G + head) * D + d;
    p.out[out_index] = to_bf16_bits(total * head_inv_sum[head]);
  }

  const int64_t base = p.segment_token_offsets[segment];
  const int length = static_cast<int>(p.segment_token_offsets[segment + 1] - base);
  const int32_t* table = p.page_ids + p.page_offsets[segment];
  for (int slot = head * blockDim.x + threadIdx.x; slot < length; slot += G * blockDim.x) {
    float weight = 0.0f;
#pragma unroll
    for (int h = 0; h < G; ++h) {
      weight += exp2f(p.logits[(base + slot) * G + h] - head_max[h]) * head_inv_sum[h];
    }
    p.scores[pool_row(table, slot, p.page_size)] = weight;
  }
}

}  // namespace

int decode_attention_ctas_per_sm(int head_dim, int group) {
  int ctas = 0;
  dispatch_decode_shape(head_dim, group, [&](auto dim, auto grp) {
    constexpr int D = decltype(dim)::value;
    constexpr int G = decltype(grp)::value;
    const auto kernel = decode_attention_kernel<D, G>;
    EKVA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         TileConfig<D>::kSmemBytes));
    EKVA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads,
                                                                  TileConfig<D>::kSmemBytes));
  });
  return ctas;
}

void launch_decode_attention(const DecodeLaunch& launch, cudaStream_t stream) {
  dispatch_decode_shape(launch.head_dim, launch.group, [&](auto dim, auto grp) {
    constexpr int D = decltype(dim)::value;
    constexpr int G = decltype(grp)::value;
    // The launch and the schedule reads overlap the tail of the kernel before.
    launch_overlapping(decode_attention_kernel<D, G>, dim3(launch.num_ctas), kThreads,
                       TileConfig<D>::kSmemBytes, stream, launch);
    if (launch.scores != nullptr) {
      decode_reduce_kernel<D, G>
          <<<dim3(launch.num_segments, G), kReduceWarps * 32, 0, stream>>>(launch);
      EKVA_CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace ekva::cuda
