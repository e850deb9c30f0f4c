// Device KV operations: append with RoPE, compaction of flagged slots, top-k eviction selection.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace ekva::cuda {
namespace {

// One thread per (token, KV head, rotary pair).
__global__ void append_kv_kernel(const AppendLaunch p) {
  const int half = p.head_dim / 2;
  const int64_t total = static_cast<int64_t>(p.count) * p.num_kv_heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int pair = static_cast<int>(i % half);
    const int64_t token_head = i / half;
    const int token = static_cast<int>(token_head / p.num_kv_heads);
    const int kv_head = static_cast<int>(token_head % p.num_kv_heads);
    const int segment = p.sequences[token] * p.num_kv_heads + kv_head;
    const int slot = p.slots[token_head];
    const int32_t* table = p.page_ids + p.page_offsets[segment];
    const int table_pages = p.page_offsets[segment + 1] - p.page_offsets[segment];
    if (slot < 0 || slot / p.page_size >= table_pages) continue;
    const int64_t row = pool_row(table, slot, p.page_size);
    uint16_t* key = p.pool + key_offset(row, p.page_size, p.head_dim);
    uint16_t* value = key + static_cast<int64_t>(p.page_size) * p.head_dim;

    // As cpu::Rope: float32 angle, cos/sin in double scaled by the attention factor, then the
    // rotation in float32 without contraction so that both backends round alike.
    const float angle = __fmul_rn(static_cast<float>(p.positions[token]), p.inv_freq[pair]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)) * p.attention_factor);
    const float s = static_cast<float>(sin(static_cast<double>(angle)) * p.attention_factor);
    const float* k_in = p.keys + token_head * p.head_dim;
    const float* v_in = p.values + token_head * p.head_dim;
    const float a = k_in[pair];
    const float b = k_in[pair + half];
    key[pair] = to_bf16_bits(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    key[pair + half] = to_bf16_bits(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
    value[pair] = to_bf16_bits(v_in[pair]);
    value[pair + half] = to_bf16_bits(v_in[pair + half]);
    if (pair == 0) {
      if (p.meta != nullptr) {
        TokenMeta meta;  // routing and score are unknown until later
        meta.position = p.positions[token];
        p.meta[row] = meta;
      }
      atomicMax(p.lengths + segment, slot + 1);
    }
  }
}

constexpr int kPlanThreads = 512;
constexpr int kPlanWarps = kPlanThreads / 32;
// Slots per thread in a round: warp w owns the round's slots [w * 32 * kPlanSlotsPerThread, ...),
// lane l every 32nd of them from l, so that flags load coalesced; a flag's rank comes from warp
// ballots and the counts of the warps before.
constexpr int kPlanSlotsPerThread = 16;
constexpr int kPlanRound = kPlanThreads * kPlanSlotsPerThread;
// Tails of up to this many slots are linked in shared memory, longer ones in the scratch.
constexpr int kPlanSharedLinks = 16384;

// One CTA per segment. Evicting the flagged slots f_1 > f_2 > ... > f_k one at a time moves, at
// step j, the content of position length - j into f_j (when f_j is not last). In ascending order
// F_0 < ... < F_{k-1} (F_r = f_{k-r}) and with kept = length - k, that reads: the holes F_r < kept
// (r < holes) receive resolve(kept + r), where resolve(q) = q for an unflagged q and
// resolve(kept + r) for q = F_r: a chain through the tail [kept, length) that only moves upward.
// One pass over the flags writes each flagged slot's pool row and slot at its rank r; the tail is
// then linked by offset from kept (a tail slot kept + t: t itself if unflagged, r if it is F_r) and
// the chains resolved by pointer jumping. The scratch stretch of segment s starts at
// page_offsets[s] * page_size: move_dst[r] is hole r's pool row (the dense move list the copy
// reads), move_src[r] the slot F_r and then hole r's source row; the tail links use move_dst from
// holes on, whose rows the move list does not need.
__global__ void __launch_bounds__(kPlanThreads, 2) plan_compaction_kernel(const CompactLaunch p) {
  extern __shared__ int32_t shared_links[];
  __shared__ int warp_flagged[kPlanWarps];
  __shared__ int holes;
  const int segment = blockIdx.x;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int length = p.lengths[segment];
  const int32_t* table = p.page_ids + p.page_offsets[segment];
  const int64_t scratch = static_cast<int64_t>(p.page_offsets[segment]) * p.page_size;
  int32_t* const move_dst = p.move_dst + scratch;
  int32_t* const move_src = p.move_src + scratch;
  const int page_step = 32 / p.page_size;
  const int row_step = 32 - page_step * p.page_size;
  const uint32_t lanes_below = (1u << lane) - 1u;

  int k = 0;  // flagged slots below the current round, then in all
  for (int base = 0; base < length; base += kPlanRound) {
    // The lane's slots of the round: every 32nd from `first`, with their pool rows.
    const int first = base + warp * 32 * kPlanSlotsPerThread + lane;
    int page = first / p.page_size;
    int row = first - page * p.page_size;
    int32_t rows[kPlanSlotsPerThread];
    uint32_t ballots[kPlanSlotsPerThread];
    int in_warp = 0;
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      bool flag = false;
      if (first + i * 32 < length) {
        rows[i] = table[page] * p.page_size + row;
        flag = p.evict_flags[rows[i]] != 0;
      }
      ballots[i] = __ballot_sync(0xffffffffu, flag);
      in_warp += __popc(ballots[i]);
      page += page_step;
      row += row_step;
      if (row >= p.page_size) {
        row -= p.page_size;
        ++page;
      }
    }
    if (lane == 0) warp_flagged[warp] = in_warp;
    __syncthreads();
    int rank = k;
    for (int w = 0; w < kPlanWarps; ++w) {
      rank += w < warp ? warp_flagged[w] : 0;
      k += warp_flagged[w];
    }
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      if ((ballots[i] >> lane) & 1u) {
        const int r = rank + __popc(ballots[i] & lanes_below);
        move_dst[r] = rows[i];
        move_src[r] = first + i * 32;
      }
      rank += __popc(ballots[i]);
    }
    __syncthreads();  // warp_flagged is reused; the ranked slots are complete
  }
  const int kept = length - k;

  // holes = the number of flagged slots below kept: a search of the ascending F by the first warp,
  // 32 probes a step.
  if (warp == 0) {
    int lo = 0;  // F_r < kept for r < lo; F_r >= kept for r >= hi
    int hi = k;
    while (lo < hi) {
      const int step = (hi - lo + 31) / 32;
      const int probe = lo + lane * step;
      const int below = __popc(__ballot_sync(0xffffffffu, probe < hi && move_src[probe] < kept));
      if (below == 0) {
        hi = lo;
      } else {
        hi = min(hi, lo + below * step);
        lo += (below - 1) * step + 1;
      }
    }
    if (lane == 0) holes = lo;
  }
  __syncthreads();
  const int num_holes = holes;
  // [k]: tail offset t (slot kept + t) links to offset link[t].
  int32_t* const link = k <= kPlanSharedLinks ? shared_links : move_dst + num_holes;
#pragma unroll 4
  for (int t = threadIdx.x; t < k; t += kPlanThreads) link[t] = t;
  __syncthreads();
  for (int r = num_holes + threadIdx.x; r < k; r += kPlanThreads) link[move_src[r] - kept] = r;
  __syncthreads();

  // Pointer jumping: each round replaces every link by its link's link, so a chain of length c is
  // resolved in log2(c) rounds. Loads and stores of a round's chunk are apart by barriers: a link
  // a later chunk reads may be updated already, which is only further along its own chain.
  for (bool moved = k > 0; moved;) {
    bool changed = false;
    for (int base = 0; base < k; base += kPlanRound) {
      int32_t next[kPlanSlotsPerThread];
      int32_t after[kPlanSlotsPerThread];
#pragma unroll
      for (int i = 0; i < kPlanSlotsPerThread; ++i) {
        const int t = base + i * kPlanThreads + threadIdx.x;
        next[i] = t < k ? link[t] : t;
      }
#pragma unroll
      for (int i = 0; i < kPlanSlotsPerThread; ++i) {
        const int t = base + i * kPlanThreads + threadIdx.x;
        after[i] = next[i] != t ? link[next[i]] : next[i];
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPlanSlotsPerThread; ++i) {
        const int t = base + i * kPlanThreads + threadIdx.x;
        if (after[i] != next[i]) {
          link[t] = after[i];
          changed = true;
        }
      }
      __syncthreads();
    }
    moved = __syncthreads_or(changed);
  }

  for (int base = 0; base < num_holes; base += kPlanRound) {
    int32_t survivor[kPlanSlotsPerThread];
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      const int r = base + i * kPlanThreads + threadIdx.x;
      survivor[i] = r < num_holes ? kept + link[r] : 0;
    }
#pragma unroll
    for (int i = 0; i < kPlanSlotsPerThread; ++i) {
      const int r = base + i * kPlanThreads + threadIdx.x;
      if (r < num_holes) {
        move_src[r] = static_cast<int32_t>(pool_row(table, survivor[i], p.page_size));
      }
    }
  }
  if (threadIdx.x == 0) {
    p.move_counts[segment] = num_holes;
    p.lengths[segment] = kept;
  }
}

constexpr int kCopyThreads = 256;
constexpr int kMovesInFlight = 4;

// A warp per move (a lane per 16-byte chunk of the K row, then of the V row; head_dim <= 128).
// Each warp reads 32 consecutive entries of the move list at once and broadcasts them;
// kMovesInFlight rows are loaded before any is stored.
__global__ void __launch_bounds__(kCopyThreads) copy_moves_kernel(const CompactLaunch p) {
  const int segment = blockIdx.x;
  const int moves = p.move_counts[segment];
  const int64_t scratch = static_cast<int64_t>(p.page_offsets[segment]) * p.page_size;
  const int warps = kCopyThreads / 32;
  const int lane = threadIdx.x % 32;
  const int chunks = p.head_dim / 8;  // 16-byte chunks per row
  const int64_t lane_shift =
      (lane >= chunks ? static_cast<int64_t>(p.page_size) * p.head_dim : 0) + (lane % chunks) * 8;
  const bool lane_active = lane < 2 * chunks;
  const int stride = gridDim.y * warps * 32;
  for (int batch = (blockIdx.y * warps + threadIdx.x / 32) * 32; batch < moves; batch += stride) {
    const int count = min(32, moves - batch);
    const int32_t lane_dst = lane < count ? p.move_dst[scratch + batch + lane] : 0;
    const int32_t lane_src = lane < count ? p.move_src[scratch + batch + lane] : 0;
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

constexpr int kSelectThreads = 512;

// Order-preserving map of a float to an unsigned integer; -0 and +0 map alike (they tie).
__device__ __forceinline__ uint32_t ordered_bits(float x) {
  const uint32_t u = __float_as_uint(x == 0.0f ? 0.0f : x);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// One CTA per segment, all groups at once: a radix select (8 bits a pass) of each group's
// budget-th largest key, where key = (score, inverted slot) is unique, so exactly `budget` keys
// are >= it.
__global__ void __launch_bounds__(kSelectThreads) select_evictions_kernel(const SelectLaunch p) {
  extern __shared__ uint32_t histogram[];  // [num_groups][256]
  __shared__ unsigned long long threshold[kMaxSelectGroups];
  __shared__ int remaining[kMaxSelectGroups];
  __shared__ int counts[kMaxSelectGroups];
  const int segment = blockIdx.x;
  const int seq = segment / p.num_kv_heads;
  const int kv_head = segment - seq * p.num_kv_heads;
  const int length = p.lengths[segment];
  const int32_t* table = p.page_ids + p.page_offsets[segment];
  const int keep_from = p.keep_from_position != nullptr ? p.keep_from_position[seq] : 0x7fffffff;

  const auto group_of = [&](const TokenMeta& m) {
    if (m.position < p.sink_tokens || m.position >= keep_from) return -1;
    if (m.expert < 0 || m.expert >= p.num_experts) return -1;
    const int g = p.expert_group != nullptr ? p.expert_group[m.expert] : m.expert;
    return g >= 0 && g < p.num_groups ? g : -1;
  };
  const auto key_of = [](const TokenMeta& m, int slot) {
    return (static_cast<unsigned long long>(ordered_bits(m.score)) << 32) |
           (0xffffffffu - static_cast<uint32_t>(slot));
  };

  for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) counts[g] = 0;
  __syncthreads();
  for (int slot = threadIdx.x; slot < length; slot += blockDim.x) {
    const int g = group_of(p.meta[pool_row(table, slot, p.page_size)]);
    if (g >= 0) atomicAdd(&counts[g], 1);
  }
  __syncthreads();
  // threshold 0: keep the whole group; ~0: evict it whole (budget 0). Else selection pending.
  for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
    const int budget = p.budgets[kv_head * p.num_groups + g];
    remaining[g] = counts[g] > budget && budget > 0 ? budget : 0;
    threshold[g] = budget <= 0 ? ~0ull : 0ull;
  }
  __syncthreads();

  for (int shift = 56; shift >= 0; shift -= 8) {
    const unsigned long long decided = shift == 56 ? 0ull : ~0ull << (shift + 8);
    for (int i = threadIdx.x; i < p.num_groups * 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    for (int slot = threadIdx.x; slot < length; slot += blockDim.x) {
      const TokenMeta m = p.meta[pool_row(table, slot, p.page_size)];
      const int g = group_of(m);
      if (g < 0 || remaining[g] == 0) continue;
      const unsigned long long key = key_of(m, slot);
      if ((key & decided) == threshold[g]) {
        atomicAdd(&histogram[g * 256 + static_cast<int>((key >> shift) & 0xff)], 1u);
      }
    }
    __syncthreads();
    for (int g = threadIdx.x; g < p.num_groups; g += blockDim.x) {
      if (remaining[g] == 0) continue;
      int above = 0;
      for (int digit = 255; digit >= 0; --digit) {
        const int here = static_cast<int>(histogram[g * 256 + digit]);
        if (above + here >= remaining[g]) {
          threshold[g] |= static_cast<unsigned long long>(digit) << shift;
          remaining[g] -= above;
          break;
        }
        above += here;
      }
    }
    __syncthreads();
  }

  for (int slot = threadIdx.x; slot < length; slot += blockDim.x) {
    const int64_t row = pool_row(table, slot, p.page_size);
    const TokenMeta m = p.meta[row];
    const int g = group_of(m);
    p.evict_flags[row] = g >= 0 && key_of(m, slot) < threshold[g] ? 1 : 0;
  }
}

}  // namespace

void launch_append_kv(const AppendLaunch& launch, cudaStream_t stream) {
  const int64_t work =
      static_cast<int64_t>(launch.count) * launch.num_kv_heads * launch.head_dim / 2;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((work + threads - 1) / threads, 4096));
  append_kv_kernel<<<blocks, threads, 0, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_compact_kv(const CompactLaunch& launch, cudaStream_t stream) {
  constexpr int link_bytes = kPlanSharedLinks * sizeof(int32_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(plan_compaction_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, link_bytes));
  plan_compaction_kernel<<<launch.num_segments, kPlanThreads, link_bytes, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
  const dim3 grid(launch.num_segments, launch.copy_blocks_per_segment);
  copy_moves_kernel<<<grid, kCopyThreads, 0, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_select_evictions(const SelectLaunch& launch, cudaStream_t stream) {
  const size_t histogram_bytes = static_cast<size_t>(launch.num_groups) * 256 * sizeof(uint32_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(select_evictions_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(histogram_bytes)));
  select_evictions_kernel<<<launch.num_segments, kSelectThreads, histogram_bytes, stream>>>(launch);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
