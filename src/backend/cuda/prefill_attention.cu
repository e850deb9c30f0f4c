// Attention of runs of one sequence's tokens over the paged KV pool on the tensor cores: one CTA
// per (tile of up to kPrefillTileTokens consecutive tokens, query head), a warp per kWarpRows
// query rows, 64 slots per step with an online softmax (S = QK^T and O = PV as bf16 mma with fp32
// accumulators), the next slots' K and V copied into shared memory while the current ones are
// multiplied. Causal by each slot's stored position, as paged_attention. The kernel is bound by
// the instructions it issues, not by the tensor cores or shared memory: steps below the diagonal
// skip the mask, and a row's output is rescaled only when its maximum grows.
#include <cuda_bf16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

// Query rows per warp: one 16-row fragment. Two (each K and V fragment read from shared memory
// once for both) take registers that leave a quarter of the warps, which the issue-bound loop
// needs more (docs/BENCHMARKS.md, session 16).
constexpr int kWarpRows = 16;
constexpr int kThreads = 32 * kPrefillTileTokens / kWarpRows;
constexpr int kSlots = 64;  // per step of the slot loop

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][head_dim] bf16 tile. Chunks are
// XOR-swizzled by the row so that the eight row addresses of an ldmatrix fall in distinct banks
// (in two for head_dim 32, whose rows have only four chunks).
template <int D>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  constexpr int kSpread = D / 8 < 8 ? D / 8 : 8;
  return row * D + ((chunk ^ (row % kSpread)) * 8);
}

template <int D>
constexpr int shared_bytes() {
  return (kPrefillTileTokens + 4 * kSlots) * D * static_cast<int>(sizeof(uint16_t));
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    prefill_attention_kernel(const PagedKvLayer kv, const PrefillAttention a, float scale_log2) {
  constexpr int kChunks = D / 8;
  extern __shared__ uint4 shared_raw[];
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(shared_raw);
  uint16_t* k_tiles = q_tile + kPrefillTileTokens * D;  // two stages
  uint16_t* v_tiles = k_tiles + 2 * kSlots * D;
  __shared__ int32_t slot_pos[2][kSlots];
  __shared__ int32_t query_pos[kPrefillTileTokens];
  __shared__ int32_t max_query_pos;
  __shared__ int32_t min_query_pos;
  __shared__ int32_t last_visible_slot;

  // Later tiles of a sequence see more slots: they start first, so that the grid's last wave is
  // of short ones.
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int first = a.tiles[2 * tile];
  const int count = a.tiles[2 * tile + 1];
  const int h = blockIdx.y;
  const int group = a.num_q_heads / kv.num_kv_heads;
  const int segment = a.sequences[first] * kv.num_kv_heads + h / group;
  const int32_t* table = kv.page_ids + kv.page_offsets[segment];
  const int length = kv.lengths[segment];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    max_query_pos = INT_MIN;
    min_query_pos = INT_MAX;
    last_visible_slot = -1;
  }
  for (int c = threadIdx.x; c < kPrefillTileTokens * kChunks; c += kThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < count) {
      const float4* src = reinterpret_cast<const float4*>(
          a.q + (static_cast<int64_t>(first + r) * a.num_q_heads + h) * D + chunk * 8);
      const float4 lo = src[0], hi = src[1];
      packed = make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y),
                          pack_bf16(hi.z, hi.w));
    }
    *reinterpret_cast<uint4*>(q_tile + swizzled<D>(r, chunk)) = packed;
  }
  if (threadIdx.x < kPrefillTileTokens) {
    query_pos[threadIdx.x] = threadIdx.x < count ? a.positions[first + threadIdx.x] : INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < count) {
    atomicMax(&max_query_pos, query_pos[threadIdx.x]);
    atomicMin(&min_query_pos, query_pos[threadIdx.x]);
  }
  __syncthreads();

  const auto load_slots = [&](int stage, int step) {
    for (int c = threadIdx.x; c < kSlots * kChunks; c += kThreads) {
      const int r = c / kChunks, chunk = c % kChunks;
      const int slot = step * kSlots + r;
      const bool valid = slot < length;
      const uint16_t* key =
          kv.pool + (valid ? slot_key_offset(table, slot, kv.page_size, D) : 0) + chunk * 8;
      const int at = stage * kSlots * D + swizzled<D>(r, chunk);
      cp_async_16(shared_address(k_tiles + at), key, valid);
      cp_async_16(shared_address(v_tiles + at), key + static_cast<int64_t>(kv.page_size) * D,
                  valid);
    }
    if (threadIdx.x < kSlots) {
      const int slot = step * kSlots + threadIdx.x;
      slot_pos[stage][threadIdx.x] =
          slot < length ? kv.meta[pool_row(table, slot, kv.page_size)].position : INT_MAX;
    }
  };

  if (length > 0) load_slots(0, 0);
  cp_async_commit();
  // The slots after the last one any query of the tile sees take no steps. Slots need not be in
  // position order (eviction moves rows), so every slot's position is read.
  {
    int last = -1;
    for (int slot = threadIdx.x; slot < length; slot += kThreads) {
      if (kv.meta[pool_row(table, slot, kv.page_size)].position <= max_query_pos) last = slot;
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) atomicMax(&last_visible_slot, last);
  }
  __syncthreads();
  const int steps = (last_visible_slot + kSlots) / kSlots;

  // This thread's rows: warp * kWarpRows + lane / 4 + 8 * i for i in {0, 1}, the fragments'
  // elements 2 * i and 2 * i + 1.
  const int row_base = warp * kWarpRows + lane / 4;
  constexpr int kRows = 2;  // this thread's query rows
  int pos[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) pos[i] = query_pos[row_base + 8 * i];

  float o[D / 8][4] = {};
  float m[kRows];
  float l[kRows] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) m[i] = -INFINITY;
  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    if (step + 1 < steps) load_slots(stage ^ 1, step + 1);
    cp_async_commit();
    cp_async_wait<1>();
    // Slots all after every query of the tile (the causal upper triangle) cost no arithmetic;
    // slots all before every query (below the diagonal) need no mask.
    const bool in_step = threadIdx.x < kSlots;
    const int slot_position = in_step ? slot_pos[stage][threadIdx.x] : INT_MAX;
    const bool visible = __syncthreads_or(slot_position <= max_query_pos);
    const bool unmasked = __syncthreads_and(!in_step || slot_position <= min_query_pos);
    if (visible) {
      const uint16_t* k_tile = k_tiles + stage * kSlots * D;
      const uint16_t* v_tile = v_tiles + stage * kSlots * D;
      float s[kSlots / 8][4] = {};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        // The warp's query rows as A fragments, read again at every step: held in registers
        // through the loop they would not leave room for the accumulators.
        uint32_t qf[4];
        ldmatrix_x4(qf, shared_address(q_tile + swizzled<D>(warp * kWarpRows + lane % 16,
                                                            ks * 2 + lane / 16)));
#pragma unroll
        for (int np = 0; np < kSlots / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, shared_address(k_tile + swizzled<D>(np * 16 + lane % 8 + (lane / 16) * 8,
                                                             ks * 2 + (lane / 8) % 2)));
          mma_bf16_16816(s[2 * np], qf, b[0], b[1]);
          mma_bf16_16816(s[2 * np + 1], qf, b[2], b[3]);
        }
      }
      // Scores stay unscaled until their exponent (scale_log2 > 0 keeps their order); a step
      // with every slot before every query of the tile (most steps of a long prompt) needs no mask.
      if (!unmasked) {
#pragma unroll
        for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int p = slot_pos[stage][nt * 8 + (lane % 4) * 2 + e];
#pragma unroll
            for (int i = 0; i < kRows; ++i) {
              if (p > pos[i]) s[nt][i * 2 + e] = -INFINITY;
            }
          }
        }
      }
      float base[kRows];  // each row's new maximum, scaled
      float correction[kRows];
      bool grew = false;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kSlots / 8; ++nt) {
          tile_max = fmaxf(tile_max, fmaxf(s[nt][i * 2], s[nt][i * 2 + 1]));
        }
#pragma unroll
        for (int offset = 1; offset < 4; offset *= 2) {
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
        }
        const float new_max = fmaxf(m[i], tile_max);
        // A row that has seen nothing yet keeps exponent base 0, so that exp2 never sees inf - inf.
        base[i] = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        correction[i] = exp2f(m[i] * scale_log2 - base[i]);
        grew |= new_max != m[i];
        m[i] = new_max;
        l[i] *= correction[i];
      }
      // Once a row's maximum settles (most steps), its output needs no rescaling.
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][i * 2] *= correction[i];
            o[dt][i * 2 + 1] *= correction[i];
          }
        }
      }
#pragma unroll
      for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[nt][c] = exp2f(fmaf(s[nt][c], scale_log2, -base[c / 2]));
          l[c / 2] += s[nt][c];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kSlots / 16; ++kk) {
        const uint32_t p[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                               pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                               pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(
              b, shared_address(v_tile + swizzled<D>(kk * 16 + lane % 8 + ((lane / 8) % 2) * 8,
                                                     dp * 2 + lane / 16)));
          mma_bf16_16816(o[2 * dp], p, b[0], b[1]);
          mma_bf16_16816(o[2 * dp + 1], p, b[2], b[3]);
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait_all();

#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int offset = 1; offset < 4; offset *= 2) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], offset);
    }
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    const int row = row_base + 8 * i;
    if (row >= count) continue;
    uint16_t* out = a.out + (static_cast<int64_t>(first + row) * a.num_q_heads + h) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(out + dt * 8 + (lane % 4) * 2) =
          pack_bf16(o[dt][i * 2] * inv, o[dt][i * 2 + 1] * inv);
    }
  }
}

}  // namespace

bool prefill_attention_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

std::vector<int32_t> prefill_tiles(const int32_t* sequences, int n) {
  std::vector<int32_t> tiles;
  for (int t = 0; t < n; ++t) {
    if (t == 0 || sequences[t] != sequences[t - 1] || tiles.back() == kPrefillTileTokens) {
      tiles.push_back(t);
      tiles.push_back(0);
    }
    ++tiles.back();
  }
  return tiles;
}

void fail_unsupported_prefill_head_dim(int head_dim) {
  fail(ErrorKind::kUnsupported,
       "CUDA prefill attention: head_dim {} is not implemented (32, 64 or 128)", head_dim);
}

void prefill_attention(const PagedKvLayer& kv, const PrefillAttention& a, cudaStream_t stream) {
  if (a.num_tiles == 0) return;
  if (kv.meta == nullptr || a.num_q_heads % kv.num_kv_heads != 0) {
    fail(ErrorKind::kInvalidArgument,
         "prefill_attention: needs slot metadata and query heads ({}) a multiple of KV heads ({})",
         a.num_q_heads, kv.num_kv_heads);
  }
  constexpr double kLog2e = 1.4426950408889634;
  const float scale_log2 = static_cast<float>(kLog2e / std::sqrt(static_cast<double>(kv.head_dim)));
  dispatch_prefill_head_dim(kv.head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr int bytes = shared_bytes<D>();
    static const bool opted_in = [] {
      EKVA_CUDA_CHECK(cudaFuncSetAttribute(prefill_attention_kernel<D>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      // Two CTAs per multiprocessor (the launch bounds' register budget) need the largest carveout.
      EKVA_CUDA_CHECK(cudaFuncSetAttribute(prefill_attention_kernel<D>,
                                           cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
      return true;
    }();
    (void)opted_in;
    const dim3 grid(static_cast<unsigned>(a.num_tiles), static_cast<unsigned>(a.num_q_heads));
    prefill_attention_kernel<D><<<grid, kThreads, bytes, stream>>>(kv, a, scale_log2);
  });
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
