// Device KV operations: append with RoPE, compaction of flagged slots, decode-step eviction
// selection, and the per-slot scores.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_ops.h"

namespace ekva::cuda {
namespace {

// A team of lanes per (token, KV head) row, then per (token, query head) row, each lane holding
// kAppendPairsPerLane rotary pairs of the row as 16-byte loads of each half; teams are a power of
// two of lanes, so several rows share a warp and a row's sum of squares reduces by xor shuffles
// within its team. A prompt's rows are bound by the loads in flight, which registers limit: a warp
// of one lane per pair and one row at a time, or four pairs a lane, kept fewer rows in flight per
// multiprocessor than eight pairs a lane (docs/BENCHMARKS.md, session 34). With norm weights a row
// is first normalised with rms_norm_kernel's expressions (inverse_rms of the sum of squares in
// double, rms_normed), so that QK-norm takes no launch of its own; a norm over a token's whole
// projection, which no head's row can form alone, takes the row's 1 / rms from inverse_rms_pair,
// so that no normalised projection is written and read back.
constexpr int kAppendWarps = 8;
constexpr int kAppendPairsPerLane = 8;
__host__ __device__ constexpr int append_team_lanes(int head_dim) {
  int team = 1;
  while (team * kAppendPairsPerLane < head_dim / 2) team *= 2;
  return team;
}
// What a row looks up in the host-written step inputs: its position, and for a key row its slot's
// pool row (skip: a slot past the segment's table, which the host never plans); for a query row
// with bf16 query rows, the row they go to.
struct AppendTarget {
  bool skip = false;
  int position = 0;
  int segment = 0;
  int slot = 0;
  int64_t pool_index = 0;
  int64_t query_row = 0;
};

__device__ AppendTarget append_target(const AppendLaunch& p, bool is_key, int64_t row_head,
                                      int token) {
  AppendTarget t;
  t.position = p.positions[token];
  if (is_key) {
    t.segment = p.sequences[token] * p.num_kv_heads + static_cast<int>(row_head % p.num_kv_heads);
    t.slot = p.slots[row_head];
    const int32_t* table = p.page_ids + p.page_offsets[t.segment];
    const int table_pages = p.page_offsets[t.segment + 1] - p.page_offsets[t.segment];
    t.skip = t.slot < 0 || t.slot / p.page_size >= table_pages;
    if (!t.skip) t.pool_index = pool_row(table, t.slot, p.page_size);
  } else if (p.query_rows_bf16 != nullptr) {
    const int query_row = p.query_rows != nullptr ? p.query_rows[token] : token;
    t.query_row = static_cast<int64_t>(query_row) * p.num_q_heads +
                  (row_head - static_cast<int64_t>(token) * p.num_q_heads);
  }
  return t;
}

__global__ void __launch_bounds__(kAppendWarps * 32) append_kv_kernel(const AppendLaunch p) {
  constexpr int P = kAppendPairsPerLane;
  const int d = p.head_dim, half = d / 2, lane = threadIdx.x % 32;
  const int team = append_team_lanes(d);
  const int rows_per_warp = 32 / team;
  const int pair0 = lane % team * P;  // teams rounded up to a power of two may have idle lanes
  const int64_t kv_rows = static_cast<int64_t>(p.count) * p.num_kv_heads;
  const int64_t rows = kv_rows + static_cast<int64_t>(p.count) * p.num_q_heads;
  const auto row_token = [&](int64_t row_head, bool is_key) {
    return static_cast<int>(row_head / (is_key ? p.num_kv_heads : p.num_q_heads));
  };
  const int64_t warp_first =
      (blockIdx.x * static_cast<int64_t>(kAppendWarps) + threadIdx.x / 32) * rows_per_warp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kAppendWarps * rows_per_warp;
  const int64_t team_offset = lane / team;
  // The host writes the positions, slots and block tables before the step's first kernel: the
  // chain of lookups of the team's first row (a decode step's only one) runs while the kernel
  // before finishes.
  AppendTarget first;
  if (warp_first + team_offset < rows) {
    const int64_t r = warp_first + team_offset;
    const bool is_key = r < kv_rows;
    const int64_t row_head = is_key ? r : r - kv_rows;
    first = append_target(p, is_key, row_head, row_token(row_head, is_key));
  }
  follow_prior_grid();
  // The bound is the warp's, so that every lane reaches the team's shuffles.
  for (int64_t w = warp_first; w < rows; w += stride) {
    const int64_t r = w + team_offset;
    const bool in_range = r < rows;
    const bool is_key = r < kv_rows;
    const int64_t row_head = is_key ? r : r - kv_rows;
    const int token = in_range ? row_token(row_head, is_key) : 0;
    // A row past the end has no address (queries may be null when only keys are appended).
    float* query = !in_range || is_key ? nullptr : p.queries + row_head * d;
    const float* x = !in_range ? nullptr : is_key ? p.keys + row_head * d : query;
    const float* norm = is_key ? p.k_norm : p.q_norm;
    const bool whole_projection = p.projection_inverse_rms != nullptr;  // uniform over the grid
    // A whole projection's weights: the head's slice.
    if (whole_projection && in_range) {
      const int heads = is_key ? p.num_kv_heads : p.num_q_heads;
      norm += (row_head - static_cast<int64_t>(token) * heads) * d;
    }
    // The row's loads are issued before a later row's lookups and before anything is stored (the
    // queries are rotated in place); the norm weights too: loaded after the sum of squares, they
    // were a second round trip.
    float a[P] = {}, b[P] = {}, va[P] = {}, vb[P] = {}, na[P] = {}, nb[P] = {};
    float2 rotation[P] = {};
    // A lane's pairs are 16-byte chunks of each half; a chunk past the half (a team of one lane
    // holding more pairs than the row has) is neither read nor written.
    const auto chunk_held = [&](int c) { return in_range && pair0 + 4 * c < half; };
    const auto load = [&](const float* src, float(&dst)[P]) {
#pragma unroll
      for (int c = 0; c < P / 4; ++c) {
        if (!chunk_held(c)) continue;
        const float4 v = reinterpret_cast<const float4*>(src)[c];
        dst[4 * c] = v.x;
        dst[4 * c + 1] = v.y;
        dst[4 * c + 2] = v.z;
        dst[4 * c + 3] = v.w;
      }
    };
    load(x + pair0, a);
    load(x + half + pair0, b);
#pragma unroll
    for (int c = 0; c < P / 4; ++c) {
      if (!chunk_held(c)) continue;
      const float4* cs = reinterpret_cast<const float4*>(
          p.rotations + static_cast<int64_t>(token) * half + pair0 + 4 * c);
      const float4 lo = cs[0], hi = cs[1];
      rotation[4 * c] = make_float2(lo.x, lo.y);
      rotation[4 * c + 1] = make_float2(lo.z, lo.w);
      rotation[4 * c + 2] = make_float2(hi.x, hi.y);
      rotation[4 * c + 3] = make_float2(hi.z, hi.w);
    }
    if (norm != nullptr) {
      load(norm + pair0, na);
      load(norm + half + pair0, nb);
    }
    if (is_key) {
      load(p.values + row_head * d + pair0, va);
      load(p.values + row_head * d + half + pair0, vb);
    }
    float inv = 1.0f;
    if (whole_projection && in_range) {
      inv = p.projection_inverse_rms[is_key ? p.count + token : token];
    }
    AppendTarget target;
    if (in_range) target = w == warp_first ? first : append_target(p, is_key, row_head, token);
    if (!whole_projection && p.q_norm != nullptr) {  // both norms or neither: uniform
      double ss = 0.0;
#pragma unroll
      for (int k = 0; k < P; ++k) {
        ss += static_cast<double>(a[k]) * a[k] + static_cast<double>(b[k]) * b[k];
      }
      for (int offset = team / 2; offset > 0; offset /= 2) {
        ss += __shfl_xor_sync(0xffffffffu, ss, offset);
      }
      inv = inverse_rms(ss, d, p.norm_eps);
    }
    if (!in_range || target.skip) continue;  // uniform over the team
#pragma unroll
    for (int k = 0; k < P; ++k) {
      if (norm != nullptr) {
        a[k] = rms_normed(a[k], inv, na[k]);
        b[k] = rms_normed(b[k], inv, nb[k]);
      }
      const float2 rotated = rope_rotate(a[k], b[k], rotation[k]);
      a[k] = rotated.x;
      b[k] = rotated.y;
    }
    const auto store_bf16 = [&](uint16_t* dst, const float(&v)[P]) {
#pragma unroll
      for (int c = 0; c < P / 4; ++c) {
        if (!chunk_held(c)) continue;
        reinterpret_cast<uint2*>(dst)[c] =
            make_uint2(pack_bf16(v[4 * c], v[4 * c + 1]), pack_bf16(v[4 * c + 2], v[4 * c + 3]));
      }
    };
    if (is_key) {
      uint16_t* key = p.pool + key_offset(target.pool_index, p.page_size, d);
      uint16_t* value = key + static_cast<int64_t>(p.page_size) * d;
      store_bf16(key + pair0, a);
      store_bf16(key + half + pair0, b);
      store_bf16(value + pair0, va);
      store_bf16(value + half + pair0, vb);
    } else {
      if (p.queries_in_place) {
#pragma unroll
        for (int c = 0; c < P / 4; ++c) {
          if (!chunk_held(c)) continue;
          reinterpret_cast<float4*>(query + pair0)[c] =
              make_float4(a[4 * c], a[4 * c + 1], a[4 * c + 2], a[4 * c + 3]);
          reinterpret_cast<float4*>(query + half + pair0)[c] =
              make_float4(b[4 * c], b[4 * c + 1], b[4 * c + 2], b[4 * c + 3]);
        }
      }
      if (p.query_rows_bf16 != nullptr) {
        uint16_t* out = p.query_rows_bf16 + target.query_row * d;
        store_bf16(out + pair0, a);
        store_bf16(out + half + pair0, b);
      }
    }
    if (is_key && lane % team == 0) {
      if (p.meta != nullptr) {
        TokenMeta meta;  // routing and score are unknown until later
        meta.position = target.position;
        p.meta[target.pool_index] = meta;
      }
      atomicMax(p.lengths + target.segment, target.slot + 1);
    }
  }
}

__global__ void rope_rotations_kernel(const int32_t* positions, int count, const float* inv_freq,
                                      int half, float attention_factor, float2* rotations) {
  follow_prior_grid();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < static_cast<int64_t>(count) * half; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int t = static_cast<int>(i / half), pair = static_cast<int>(i - t * half);
    rotations[i] = rope_cos_sin(positions[t], inv_freq[pair], attention_factor);
  }
}

constexpr int kPlanThreads = 512;
constexpr int kPlanWarps = kPlanThreads / 32;
// Slots per thread in a round: warp w owns the round's slots [w * 32 * kPlanSlotsPerThread, ...),
// lane l every 32nd of them from l, so that flags load coalesced; a flag's rank comes from warp
// ballots and the counts of the warps before.
constexpr int kPlanSlotsPerThread = 16;
constexpr int kPlanRound = kPlanThreads * kPlanSlotsPerThread;

// The sum of every thread's value; ends with a barrier, so `partial` can be reused at once.
__device__ __forceinline__ int plan_sum(int value, int* partial) {
  value = __reduce_add_sync(0xffffffffu, value);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  int total = 0;
#pragma unroll
  for (int w = 0; w < kPlanWarps; ++w) total += partial[w];
  __syncthreads();
  return total;
}

// One CTA per segment, KvLayout::evict_flagged's order: with kept = length - flagged, the r-th
// flagged slot below kept (a hole) receives the r-th unflagged slot at or past kept. A first pass
// counts the flags, so that the second writes only what the copy reads: each hole's pool row at
// its rank r among the flagged, and each unflagged slot past kept its row at its rank among the
// unflagged (slot - flagged below it). The unflagged below kept number kept - holes, so hole r's
// survivor is kept_rows[kept - holes + r]. The second pass finds the flags in L2. The scratch
// stretch of segment s starts at page_offsets[s] * page_size.
__global__ void __launch_bounds__(kPlanThreads, 2) plan_compaction_kernel(const CompactLaunch p) {
  __shared__ int warp_counts[kPlanWarps];
  allow_next_grid();  // the copy waits for the whole plan
  const int segment = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int length = p.lengths[segment];
  const int32_t* table = p.page_ids + p.page_offsets[segment];
  const int64_t scratch = static_cast<int64_t>(p.page_offsets[segment]) * p.page_size;
  int32_t* const hole_rows = p.hole_rows + scratch;
  int32_t* const kept_rows = p.kept_rows + scratch;
  const int page_step = 32 / p.page_size;
  const int row_step = 32 - page_step * p.page_size;
  const uint32_t lanes_below = (1u << lane) - 1u;

  // The lane's slots of the round from `first`, every 32nd: their pool rows and flags.
  const auto load_round = [&](int first, int32_t(&rows)[kPlanSlotsPerThread],
                              bool(&flags)[kPlanSlotsPerThread]) {
    int page = first / p.page_size;
    int row = first - page * p.page_size;
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      rows[i] = 0;
      flags[i] = false;
      if (first + i * 32 < length) {
        rows[i] = table[page] * p.page_size + row;
        flags[i] = p.evict_flags[rows[i]] != 0;
      }
      page += page_step;
      row += row_step;
      if (row >= p.page_size) {
        row -= p.page_size;
        ++page;
      }
    }
  };

  // The count needs no order: a page per thread, its flags four at a time where the page size
  // and the flags' address let them start 4-byte aligned, so it costs far fewer instructions than
  // the ranked pass below (the plan is bound by instruction issue, not by memory).
  int flagged = 0;
  const int pages = (length + p.page_size - 1) / p.page_size;
  const bool words = p.page_size % 4 == 0 && reinterpret_cast<uintptr_t>(p.evict_flags) % 4 == 0;
  for (int j = threadIdx.x; j < pages; j += kPlanThreads) {
    const uint8_t* const page_flags = p.evict_flags + static_cast<int64_t>(table[j]) * p.page_size;
    const int in_page = min(p.page_size, length - j * p.page_size);
    if (words) {
      for (int b = 0; b < in_page; b += 4) {
        uint32_t word = *reinterpret_cast<const uint32_t*>(page_flags + b);
        if (in_page - b < 4) word &= (1u << (8 * (in_page - b))) - 1u;  // slots past the length
        flagged += __popc(__vcmpne4(word, 0u)) / 8;
      }
    } else {
      for (int b = 0; b < in_page; ++b) flagged += page_flags[b] != 0;
    }
  }
  const int kept = length - plan_sum(flagged, warp_counts);

  int k = 0;      // flagged slots below the current round
  int holes = 0;  // the thread's flagged slots below kept
  for (int base = 0; base < length; base += kPlanRound) {
    const int first = base + warp * 32 * kPlanSlotsPerThread + lane;
    int32_t rows[kPlanSlotsPerThread];
    bool flags[kPlanSlotsPerThread];
    load_round(first, rows, flags);
    uint32_t ballots[kPlanSlotsPerThread];
    int in_warp = 0;
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      ballots[i] = __ballot_sync(0xffffffffu, flags[i]);
      in_warp += __popc(ballots[i]);
    }
    if (lane == 0) warp_counts[warp] = in_warp;
    __syncthreads();
    int rank = k;
    for (int w = 0; w < kPlanWarps; ++w) {
      rank += w < warp ? warp_counts[w] : 0;
      k += warp_counts[w];
    }
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      const int slot = first + i * 32;
      const int r = rank + __popc(ballots[i] & lanes_below);
      if (flags[i] && slot < kept) {
        hole_rows[r] = rows[i];
        ++holes;
      } else if (!flags[i] && slot >= kept && slot < length) {
        kept_rows[slot - r] = rows[i];
      }
      rank += __popc(ballots[i]);
    }
    __syncthreads();  // warp_counts is reused
  }
  holes = plan_sum(holes, warp_counts);
  if (threadIdx.x == 0) {
    p.move_counts[segment] = holes;
    p.lengths[segment] = kept;
  }
}

constexpr int kCopyThreads = 256;
constexpr int kMovesInFlight = 4;

// A warp per move (a lane per 16-byte chunk of the K row, then of the V row; head_dim <= 128).
// Each warp reads 32 consecutive holes and their survivors at once and broadcasts them;
// kMovesInFlight rows are loaded before any is stored.
__global__ void __launch_bounds__(kCopyThreads) copy_moves_kernel(const CompactLaunch p) {
  wait_for_prior_grid();
  const int segment = blockIdx.x;
  const int moves = p.move_counts[segment];
  const int64_t scratch = static_cast<int64_t>(p.page_offsets[segment]) * p.page_size;
  const int32_t* const hole_rows = p.hole_rows + scratch;
  // The plan left the new length, kept, in lengths: hole r's survivor has unflagged rank
  // kept - holes + r.
  const int32_t* const survivor_rows = p.kept_rows + scratch + (p.lengths[segment] - moves);
  const int warps = kCopyThreads / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = p.head_dim / 8;  // 16-byte chunks per row
  const int64_t lane_shift =
      (lane >= chunks ? static_cast<int64_t>(p.page_size) * p.head_dim : 0) + (lane % chunks) * 8;
  const bool lane_active = lane < 2 * chunks;
  const int stride = gridDim.y * warps * 32;
  for (int batch = (blockIdx.y * warps + threadIdx.x / 32) * 32; batch < moves; batch += stride) {
    const int count = min(32, moves - batch);
    const int32_t lane_dst = lane < count ? hole_rows[batch + lane] : 0;
    const int32_t lane_src = lane < count ? survivor_rows[batch + lane] : 0;
    for (int first = 0; first < count; first += kMovesInFlight) {
      int64_t dst[kMovesInFlight];
      uint4 data[kMovesInFlight];
#pragma unroll
      for (int i = 0; i < kMovesInFlight; ++i) {
        dst[i] = __shfl_sync(0xffffffffu, lane_dst, first + i);
        const int64_t src = __shfl_sync(0xffffffffu, lane_src, first + i);
        if (first + i < count && lane_active) {
          data[i] = *reinterpret_cast<const uint4*>(
              p.pool + key_offset(src, p.page_size, p.head_dim) + lane_shift);
        }
        if (first + i < count && lane == 0 && p.meta != nullptr) p.meta[dst[i]] = p.meta[src];
      }
#pragma unroll
      for (int i = 0; i < kMovesInFlight; ++i) {
        if (first + i < count && lane_active) {
          *reinterpret_cast<uint4*>(p.pool + key_offset(dst[i], p.page_size, p.head_dim) +
                                    lane_shift) = data[i];
        }
      }
    }
  }
}

constexpr int kEvictThreads = 256;

// Order-preserving map of a float to an unsigned integer; -0 and +0 map alike (they tie).
__device__ __forceinline__ uint32_t ordered_bits(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// The order a decode eviction takes candidates in, smallest first: the lowest score, then the
// latest position (select_evictions keeps the highest scores, earliest positions first). Positions
// are distinct within a table, so no two candidates share a key.
__device__ __forceinline__ unsigned long long eviction_key(const TokenMeta& m) {
  return (static_cast<unsigned long long>(ordered_bits(m.score)) << 32) |
         (0xffffffffu - static_cast<uint32_t>(m.position));
}

__device__ __forceinline__ bool is_pinned(const int32_t* pinned, int n, int32_t position) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pinned[mid] < position) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && pinned[lo] == position;
}

// The CTA's smallest (key, slot); every thread returns it.
__device__ void cta_min(unsigned long long& key, int& slot, unsigned long long* keys, int* slots) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned long long k = __shfl_down_sync(0xffffffffu, key, offset);
    const int s = __shfl_down_sync(0xffffffffu, slot, offset);
    if (k < key) {
      key = k;
      slot = s;
    }
  }
  if (threadIdx.x % 32 == 0) {
    keys[threadIdx.x / 32] = key;
    slots[threadIdx.x / 32] = slot;
  }
  __syncthreads();
  key = keys[0];
  slot = slots[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
    if (keys[w] < key) {
      key = keys[w];
      slot = slots[w];
    }
  }
  __syncthreads();  // keys and slots are free again
}

// One CTA per listed segment: select_evictions for a table a decode step has outgrown by a few
// slots, then KvLayout::evict_slots' compaction of it. Protected slots (sinks, the recent window,
// pinned positions) stay; with room for `remaining` candidates, the others go lowest key first (one
// pass per eviction); with none, every candidate goes.
__global__ void __launch_bounds__(kEvictThreads) evict_decode_kernel(const DecodeEvictLaunch p) {
  __shared__ unsigned long long warp_keys[kEvictThreads / 32];
  __shared__ int warp_slots[kEvictThreads / 32];
  __shared__ int counts[2];  // protected, candidates
  __shared__ int candidates[kMaxDecodeEvictions];
  __shared__ int holes[kMaxDecodeEvictions], survivors[kMaxDecodeEvictions];
  __shared__ int num_moves;
  const int32_t* q = p.params + static_cast<int64_t>(blockIdx.x) * kDecodeEvictParams;
  const int32_t* table = p.ints + q[0];
  const int length = q[1], keep = q[2], sinks = q[3], recent_from = q[4];
  const int32_t* pinned = p.pinned + q[5];
  const int num_pinned = q[6] - q[5];
  if (threadIdx.x < 2) counts[threadIdx.x] = 0;
  __syncthreads();
  const auto is_candidate = [&](const TokenMeta& m) {
    return m.position >= sinks && m.position < recent_from &&
           !is_pinned(pinned, num_pinned, m.position);
  };
  int protected_here = 0;
  unsigned long long key = ~0ull;
  int slot = -1;
  for (int i = threadIdx.x; i < length; i += blockDim.x) {
    const TokenMeta m = p.meta[pool_row(table, i, p.page_size)];
    if (!is_candidate(m)) {
      ++protected_here;
      continue;
    }
    const int rank = atomicAdd(&counts[1], 1);
    if (rank < p.max_evictions) candidates[rank] = i;
    const unsigned long long k = eviction_key(m);
    if (k < key) {
      key = k;
      slot = i;
    }
  }
  atomicAdd(&counts[0], protected_here);
  cta_min(key, slot, warp_keys, warp_slots);  // its barrier also publishes the counts
  const int remaining = keep - counts[0];
  const int num_candidates = counts[1];
  const int evictions = remaining <= 0 ? num_candidates : max(0, num_candidates - remaining);
  if (evictions > p.max_evictions) {
    if (threadIdx.x == 0) p.num_evicted[blockIdx.x] = -1;
    return;
  }
  int32_t* out = p.evicted + static_cast<int64_t>(blockIdx.x) * p.max_evictions;
  if (evictions < num_candidates) {  // the lowest keys; else every candidate, collected above
    if (threadIdx.x == 0 && evictions > 0) candidates[0] = slot;
    for (int e = 1; e < evictions; ++e) {
      const unsigned long long last = key;
      key = ~0ull;
      slot = -1;
      for (int i = threadIdx.x; i < length; i += blockDim.x) {
        const TokenMeta m = p.meta[pool_row(table, i, p.page_size)];
        const unsigned long long k = eviction_key(m);
        if (is_candidate(m) && k > last && k < key) {
          key = k;
          slot = i;
        }
      }
      cta_min(key, slot, warp_keys, warp_slots);
      if (threadIdx.x == 0) candidates[e] = slot;
    }
  }
  if (threadIdx.x == 0) {
    for (int e = 1; e < evictions; ++e) {  // ascending slots, as KvLayout::evict_slots takes them
      const int v = candidates[e];
      int j = e;
      for (; j > 0 && candidates[j - 1] > v; --j) candidates[j] = candidates[j - 1];
      candidates[j] = v;
    }
    for (int e = 0; e < evictions; ++e) out[e] = candidates[e];
    p.num_evicted[blockIdx.x] = evictions;
    // The evicted slots below the new length are the holes; the slots at or past it that stay
    // fill them in ascending order (the evicted ones there are the tail of the sorted list).
    const int kept = length - evictions;
    int tail = 0;
    while (tail < evictions && candidates[tail] < kept) ++tail;
    int listed = tail, survivor = kept;
    for (int h = 0; h < tail; ++h) {
      while (listed < evictions && candidates[listed] == survivor) {
        ++listed;
        ++survivor;
      }
      holes[h] = candidates[h];
      survivors[h] = survivor++;
    }
    num_moves = tail;
    p.ints[q[7]] = kept;
  }
  __syncthreads();
  // A move's K and V rows in 16-byte chunks, a thread per chunk; holes and survivors are distinct
  // slots, so the moves are independent.
  const int chunks = p.head_dim / 8;
  for (int i = threadIdx.x; i < num_moves * 2 * chunks; i += blockDim.x) {
    const int move = i / (2 * chunks), chunk = i % (2 * chunks);
    const int64_t dst = pool_row(table, holes[move], p.page_size);
    const int64_t src = pool_row(table, survivors[move], p.page_size);
    const int64_t shift = (chunk >= chunks ? static_cast<int64_t>(p.page_size) * p.head_dim : 0) +
                          (chunk % chunks) * 8;
    *reinterpret_cast<uint4*>(p.pool + key_offset(dst, p.page_size, p.head_dim) + shift) =
        *reinterpret_cast<const uint4*>(p.pool + key_offset(src, p.page_size, p.head_dim) + shift);
    if (chunk == 0) p.meta[dst] = p.meta[src];
  }
}

__global__ void add_scores_kernel(TokenMeta* meta, const float* delta, int64_t rows) {
  follow_prior_grid();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    meta[r].score += delta[r];
  }
}

__global__ void gather_scores_kernel(const TokenMeta* meta, const int32_t* rows, int64_t n,
                                     float* out) {
  follow_prior_grid();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = meta[rows[i]].score;
  }
}

__global__ void scatter_scores_kernel(TokenMeta* meta, const int32_t* rows, const float* scores,
                                      int64_t n) {
  follow_prior_grid();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    meta[rows[i]].score = scores[i];
  }
}

__global__ void flag_rows_kernel(uint8_t* flags, const int32_t* rows, int64_t n) {
  follow_prior_grid();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    flags[rows[i]] = 1;
  }
}

int grid_for(int64_t work, int threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, 4096)));
}

}  // namespace

void launch_append_kv(const AppendLaunch& launch, cudaStream_t stream) {
  const int64_t rows =
      static_cast<int64_t>(launch.count) * (launch.num_kv_heads + launch.num_q_heads);
  const int64_t rows_per_block =
      static_cast<int64_t>(kAppendWarps) * (32 / append_team_lanes(launch.head_dim));
  const int blocks =
      static_cast<int>(std::min<int64_t>((rows + rows_per_block - 1) / rows_per_block, 8192));
  launch_overlapping(append_kv_kernel, dim3(blocks), dim3(kAppendWarps * 32), 0, stream, launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_rope_rotations(const int32_t* positions, int count, const float* inv_freq, int half,
                           float attention_factor, float2* rotations, cudaStream_t stream) {
  constexpr int kThreads = 256;
  launch_overlapping(rope_rotations_kernel,
                     dim3(grid_for(static_cast<int64_t>(count) * half, kThreads)), dim3(kThreads),
                     0, stream, positions, count, inv_freq, half, attention_factor, rotations);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_compact_kv(const CompactLaunch& launch, cudaStream_t stream) {
  plan_compaction_kernel<<<launch.num_segments, kPlanThreads, 0, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
  launch_overlapping(copy_moves_kernel, dim3(launch.num_segments, launch.copy_blocks_per_segment),
                     kCopyThreads, 0, stream, launch);
}

void launch_evict_decode(const DecodeEvictLaunch& launch, cudaStream_t stream) {
  evict_decode_kernel<<<launch.count, kEvictThreads, 0, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void add_scores(TokenMeta* meta, const float* delta, int64_t rows, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_overlapping(add_scores_kernel, dim3(grid_for(rows, 256)), dim3(256), 0, stream, meta,
                     delta, rows);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void gather_scores(const TokenMeta* meta, const int32_t* rows, int64_t n, float* out,
                   cudaStream_t stream) {
  if (n <= 0) return;
  launch_overlapping(gather_scores_kernel, dim3(grid_for(n, 256)), dim3(256), 0, stream, meta, rows,
                     n, out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void scatter_scores(TokenMeta* meta, const int32_t* rows, const float* scores, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0) return;
  launch_overlapping(scatter_scores_kernel, dim3(grid_for(n, 256)), dim3(256), 0, stream, meta,
                     rows, scores, n);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void flag_rows(uint8_t* flags, const int32_t* rows, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch_overlapping(flag_rows_kernel, dim3(grid_for(n, 256)), dim3(256), 0, stream, flags, rows,
                     n);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
