// Attention of runs of one sequence's tokens over the paged KV pool on the tensor cores: one CTA
// per (tile of up to kPrefillTileTokens consecutive tokens, query head), 64 slots per step with an
// online softmax (S = QK^T and O = PV on the warpgroup MMA, Q, K and V from shared memory, P from
// registers; bf16 with fp32 accumulators). A producer warpgroup copies the slots into a ring of
// stages ahead of two consumer warpgroups of 64 query rows each (below). Causal by each slot's
// stored position, as paged_attention. Steps below the diagonal skip the mask, and a row's output
// is rescaled only when its maximum grows.
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

// A producer warpgroup copies each step's slots into a ring of stages; a consumer warpgroup per 64
// query rows multiplies them. The roles meet at mbarriers (a stage full, a stage empty) instead of
// a CTA barrier a step, so that the two consumers drift apart and one's softmax runs while the
// other's products do; and the producer gives its registers to the consumers (setmaxnreg), which
// hold a step's S and the step before's P and O at once: each step's S product is issued with the
// previous step's PV product, and the softmax runs while the PV product does.
constexpr int kWarpRows = 16;  // a warpgroup's m64 products hold 16 rows in each of its warps
constexpr int kGroupRows = 64;
constexpr int kConsumers = kPrefillTileTokens / kGroupRows;
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kSlots = 64;  // per step of the slot loop
constexpr int kStages = 4;
// 128 x 40 + 256 x 232 registers: the 384 x 168 that the launch bounds give the CTA.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;

// Q, K and V as the warpgroup MMA reads them (Q and K K-major, V N-major): column blocks of 64
// elements, each [rows][64] with the 128-byte swizzle. head_dim 32 pads its rows to 64 (with zeros
// in Q and K; V's padding only makes output columns that are not written).
constexpr int kBlockCols = 64;
template <int D>
constexpr int kOperandCols = D < kBlockCols ? kBlockCols : D;
template <int Rows>
__device__ __forceinline__ int operand_at(int row, int chunk) {
  return (chunk / 8) * Rows * kBlockCols + row * kBlockCols + ((chunk % 8) ^ (row % 8)) * 8;
}

// Q, the stages of K and V, and room to align the tiles to the swizzle's 1024-byte atoms.
template <int D>
constexpr int shared_bytes() {
  return (kPrefillTileTokens + 2 * kStages * kSlots) * kOperandCols<D> *
             static_cast<int>(sizeof(uint16_t)) +
         1024;
}

// The position a slot past the segment's end copies: after every query.
__device__ const int32_t kNoPosition = INT_MAX;

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on bar once the thread's cp.async copies issued so far have landed.
__device__ __forceinline__ void mbarrier_arrive_after_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "WAIT:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}
template <int Registers>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_attention_kernel(const PagedKvLayer kv, const PrefillAttention a, float scale_log2) {
  constexpr int kChunks = D / 8;
  constexpr int kOC = kOperandCols<D>;
  extern __shared__ uint4 shared_raw[];
  const uint32_t raw = shared_address(shared_raw);
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(shared_raw) +
                                                 (((raw + 1023) & ~1023u) - raw));
  uint16_t* k_tiles = q_tile + kPrefillTileTokens * kOC;
  uint16_t* v_tiles = k_tiles + kStages * kSlots * kOC;
  __shared__ int32_t slot_pos[kStages][kSlots];
  __shared__ int32_t query_pos[kPrefillTileTokens];
  __shared__ int32_t max_query_pos;
  __shared__ int32_t last_visible_slot;
  __shared__ uint64_t full[kStages], empty[kStages];

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
  const int warpgroup = warp / 4;

  if (threadIdx.x == 0) {
    max_query_pos = INT_MIN;
    last_visible_slot = -1;
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(shared_address(&full[s]), 128);                // the producer's threads
      mbarrier_init(shared_address(&empty[s]), 128 * kConsumers);  // the consumers' threads
    }
    // The initialised barriers seen by the copies' asynchronous arrivals too.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int c = threadIdx.x; c < kPrefillTileTokens * kChunks; c += kThreads) {
    const int r = c / kChunks, chunk = c % kChunks;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (r < count) {
      packed = *reinterpret_cast<const uint4*>(
          a.q + (static_cast<int64_t>(first + r) * a.num_q_heads + h) * D + chunk * 8);
    }
    *reinterpret_cast<uint4*>(q_tile + operand_at<kPrefillTileTokens>(r, chunk)) = packed;
  }
  // head_dim 32's zero columns of Q and of every stage of K, which no copy writes.
  constexpr int kPadChunks = kOC / 8 - kChunks;
  if constexpr (kPadChunks > 0) {
    for (int c = threadIdx.x; c < (kPrefillTileTokens + kStages * kSlots) * kPadChunks;
         c += kThreads) {
      const int r = c / kPadChunks, chunk = kChunks + c % kPadChunks;
      uint16_t* at = r < kPrefillTileTokens
                         ? q_tile + operand_at<kPrefillTileTokens>(r, chunk)
                         : k_tiles + (r - kPrefillTileTokens) / kSlots * kSlots * kOC +
                               operand_at<kSlots>((r - kPrefillTileTokens) % kSlots, chunk);
      *reinterpret_cast<uint4*>(at) = make_uint4(0, 0, 0, 0);
    }
  }
  if (threadIdx.x < kPrefillTileTokens) {
    query_pos[threadIdx.x] = threadIdx.x < count ? a.positions[first + threadIdx.x] : INT_MIN;
  }
  __syncthreads();
  if (threadIdx.x < count) atomicMax(&max_query_pos, query_pos[threadIdx.x]);
  __syncthreads();

  // The slots after the last one any query of the tile sees take no steps. Slots need not be in
  // position order (eviction moves rows), so every slot's position is read. A thread's slots are
  // kThreads apart: its page and row step along with them, with no division per slot (a 4096-slot
  // segment's scan took 16 per thread).
  {
    int last = -1;
    const int page_step = kThreads / kv.page_size, row_step = kThreads % kv.page_size;
    int page = threadIdx.x / kv.page_size, row = threadIdx.x % kv.page_size;
    for (int slot = threadIdx.x; slot < length; slot += kThreads) {
      const int64_t at = static_cast<int64_t>(table[page]) * kv.page_size + row;
      if (kv.meta[at].position <= max_query_pos) last = slot;
      page += page_step;
      row += row_step;
      if (row >= kv.page_size) {
        row -= kv.page_size;
        ++page;
      }
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) atomicMax(&last_visible_slot, last);
  }
  fence_proxy_async_shared();  // Q's stores seen by the tensor cores' reads
  __syncthreads();
  const int steps = (last_visible_slot + kSlots) / kSlots;

  if (warpgroup == 0) {
    // The producer: two threads a slot, each copying half of its key's and value's chunks, which
    // look its page up once. A thread's chunks are two apart, so that each copy instruction reads
    // whole 64-byte runs of its slots' rows, and odd slots take their runs in the other order, so
    // that a quarter-warp's two slots write distinct banks.
    registers_down<kProducerRegisters>();
    constexpr int kSlotThreads = 128 / kSlots;
    constexpr int kSlotChunks = kChunks / kSlotThreads;
    static_assert(kChunks % kSlotThreads == 0);
    const int copy_slot = threadIdx.x / kSlotThreads, copy_part = threadIdx.x % kSlotThreads;
    for (int step = 0; step < steps; ++step) {
      const int stage = step % kStages;
      // The stage's previous slots, step - kStages, released by both consumers.
      if (step >= kStages) mbarrier_wait(shared_address(&empty[stage]), (step / kStages - 1) & 1);
      const int slot = step * kSlots + copy_slot;
      const bool valid = slot < length;
      int64_t page = 0;
      int row = 0;
      if (valid) {
        const int page_index = slot / kv.page_size;
        page = table[page_index];
        row = slot - page_index * kv.page_size;
      }
      const int64_t pool_row = page * kv.page_size + row;
      const uint16_t* key = kv.pool + (page * 2 * kv.page_size + row) * D;
#pragma unroll
      for (int j = 0; j < kSlotChunks; ++j) {
        const int chunk = ((j ^ (copy_slot % 2)) % kSlotChunks) * kSlotThreads + copy_part;
        const int at = stage * kSlots * kOC + operand_at<kSlots>(copy_slot, chunk);
        cp_async_16(shared_address(k_tiles + at), key + chunk * 8, valid);
        cp_async_16(shared_address(v_tiles + at),
                    key + static_cast<int64_t>(kv.page_size) * D + chunk * 8, valid);
      }
      if (copy_part == 0) {
        cp_async_4(shared_address(&slot_pos[stage][copy_slot]),
                   valid ? &kv.meta[pool_row].position : &kNoPosition);
      }
      mbarrier_arrive_after_copies(shared_address(&full[stage]));
    }
    cp_async_wait_all();
    return;
  }

  registers_up<kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  // This thread's rows: row_base + 8 * i for i in {0, 1}, the fragments' elements 2 * i and
  // 2 * i + 1.
  const int row_base = consumer * kGroupRows + (warp % 4) * kWarpRows + lane / 4;
  constexpr int kRows = 2;
  int pos[kRows];
  // The warp's own query positions bound which steps it must mask; its warpgroup's (which
  // multiplies S for all of its 64 rows at once) which steps it sees: on a tile's diagonal, the
  // warpgroup of the earlier rows skips the steps of later slots.
  int warp_min = INT_MAX;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    pos[i] = query_pos[row_base + 8 * i];
    if (row_base + 8 * i < count) warp_min = min(warp_min, pos[i]);
  }
  warp_min = __reduce_min_sync(0xffffffffu, warp_min);
  static_assert(kSlots == 64, "each lane reads two slots' positions");
  const int group_max = __reduce_max_sync(  // INT_MIN past the tile's tokens
      0xffffffffu,
      max(query_pos[consumer * kGroupRows + lane], query_pos[consumer * kGroupRows + lane + 32]));
  // The warpgroup's Q rows and the K stages as descriptors' start addresses, in bytes.
  const uint32_t q_at = shared_address(q_tile + consumer * kGroupRows * kBlockCols);
  const uint32_t k_at = shared_address(k_tiles), v_at = shared_address(v_tiles);

  float o[kOC / 8][4] = {};  // head_dim 32: the first four blocks
  float(&output)[kOC / 2] = reinterpret_cast<float(&)[kOC / 2]>(o);
  float m[kRows];
  float l[kRows] = {};
#pragma unroll
  for (int i = 0; i < kRows; ++i) m[i] = -INFINITY;
  uint32_t p[kSlots / 16][4] = {};  // P as the A fragments of the k-steps of O += PV
  uint32_t(&p_words)[kSlots / 4] = reinterpret_cast<uint32_t(&)[kSlots / 4]>(p);
  float s[kSlots / 8][4];  // S, then P, of a step
  float(&scores)[kSlots / 2] = reinterpret_cast<float(&)[kSlots / 2]>(s);

  // Waits for the step's slots and issues its S product (whether or not the warpgroup sees them,
  // so that every step's products are issued and waited for the same way: with the products
  // issued under conditions, ptxas serialised them).
  const auto issue_s = [&](int step) {
    const int stage = step % kStages;
    mbarrier_wait(shared_address(&full[stage]), (step / kStages) & 1);
    fence_proxy_async_shared();  // the copies seen by the tensor cores' reads
    const uint32_t k_stage = k_at + stage * kSlots * kOC * 2;
    wgmma_fence_operands(output);
    wgmma_fence_operands(p_words);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kOC / 16; ++ks) {
      // k-step ks: column block ks / 4, 32 bytes into its rows per step within it.
      const uint64_t q_desc =
          wgmma_descriptor(q_at + (ks / 4) * kPrefillTileTokens * kBlockCols * 2 + (ks % 4) * 32);
      const uint64_t k_desc =
          wgmma_descriptor(k_stage + (ks / 4) * kSlots * kBlockCols * 2 + (ks % 4) * 32);
      if (ks == 0) {
        wgmma_m64n64k16_bf16<false>(scores, q_desc, k_desc);
      } else {
        wgmma_m64n64k16_bf16<true>(scores, q_desc, k_desc);
      }
    }
    wgmma_commit();
  };
  // O += P V over the stage of `step`, issued and committed.
  const auto issue_pv = [&](int step) {
    const uint32_t v_stage = v_at + (step % kStages) * kSlots * kOC * 2;
#pragma unroll
    for (int kk = 0; kk < kSlots / 16; ++kk) {
      // k-step kk: slots 16 kk .. 16 kk + 15, two of V's 8-row atoms.
      const uint64_t v_desc =
          wgmma_descriptor_n_major(v_stage + kk * 16 * kBlockCols * 2, kSlots * kBlockCols * 2);
      if constexpr (kOC == 128) {
        wgmma_m64n128k16_bf16_n_major(output, p[kk], v_desc);
      } else {
        wgmma_m64n64k16_bf16_n_major(output, p[kk], v_desc);
      }
    }
    wgmma_commit();
  };
  // The step's softmax, its S product waited for: masks, the rows' new maxima (their correction
  // for O and l in `correction`), exponents into s and their sums into l; whether any row's
  // maximum grew. A step the warpgroup does not see leaves everything as it was.
  float correction[kRows];
  const auto softmax = [&](int step, bool& visible) {
    const int stage = step % kStages;
    // Slots all after every query of the warpgroup (the causal upper triangle) cost it no
    // arithmetic; slots all before every query of the warp (below the diagonal) need no mask.
    const int first_position = slot_pos[stage][lane], second_position = slot_pos[stage][lane + 32];
    visible = __any_sync(0xffffffffu, min(first_position, second_position) <= group_max);
    const bool unmasked = __all_sync(0xffffffffu, max(first_position, second_position) <= warp_min);
    bool grew = false;
    if (!visible) return grew;
    // Scores stay unscaled until their exponent (scale_log2 > 0 keeps their order); a step with
    // every slot before every query of the warp (most steps of a long prompt) needs no mask.
    if (!unmasked) {
#pragma unroll
      for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int position = slot_pos[stage][nt * 8 + (lane % 4) * 2 + e];
#pragma unroll
          for (int i = 0; i < kRows; ++i) {
            if (position > pos[i]) s[nt][i * 2 + e] = -INFINITY;
          }
        }
      }
    }
    float base[kRows];  // each row's new maximum, scaled
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
      correction[i] = exp2_flush_subnormal(m[i] * scale_log2 - base[i]);
      grew |= new_max != m[i];
      m[i] = new_max;
      l[i] *= correction[i];
    }
#pragma unroll
    for (int nt = 0; nt < kSlots / 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        s[nt][c] = exp2_flush_subnormal(fmaf(s[nt][c], scale_log2, -base[c / 2]));
        l[c / 2] += s[nt][c];
      }
    }
    return grew;
  };
  // With the PV product of the step before waited for: O rescaled where a maximum grew, and P of
  // this step (zeros for a step the warpgroup does not see).
  const auto next_p = [&](bool visible, bool grew) {
    if (!visible) {
#pragma unroll
      for (int w = 0; w < kSlots / 4; ++w) p_words[w] = 0u;
      return;
    }
    // Once a row's maximum settles (most steps), its output needs no rescaling.
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
#pragma unroll
        for (int dt = 0; dt < kOC / 8; ++dt) {
          o[dt][i * 2] *= correction[i];
          o[dt][i * 2 + 1] *= correction[i];
        }
      }
    }
#pragma unroll
    for (int kk = 0; kk < kSlots / 16; ++kk) {
      p[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      p[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      p[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      p[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  };

  if (steps > 0) {
    issue_s(0);
    wgmma_wait<0>();
    wgmma_fence_operands(scores);
    bool visible = false;
    const bool grew = softmax(0, visible);
    next_p(visible, grew);
    for (int step = 1; step < steps; ++step) {
      issue_s(step);
      issue_pv(step - 1);
      wgmma_wait<1>();
      wgmma_fence_operands(scores);
      const bool step_grew = softmax(step, visible);
      wgmma_wait<0>();
      wgmma_fence_operands(output);
      wgmma_fence_operands(p_words);
      // The step before's K and V are read: the producer may refill their stage.
      mbarrier_arrive(shared_address(&empty[(step - 1) % kStages]));
      next_p(visible, step_grew);
    }
    wgmma_fence_operands(output);
    wgmma_fence_operands(p_words);
    wgmma_fence();
    issue_pv(steps - 1);
    wgmma_wait<0>();
    wgmma_fence_operands(output);
  }

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
      // The stages take most of a multiprocessor's shared memory.
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
