// Attention of runs of one sequence's tokens over the paged KV pool on the tensor cores: one CTA
// per (tile of up to kPrefillTileTokens consecutive tokens, query head), 128 slots per step with an
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
// previous step's PV product, and the softmax runs while the PV product does. A stage's keys (with
// their positions) and its values have barriers of their own: the keys are free once the step's
// softmax has read its scores, the values only once the next step's PV product is done.
constexpr int kWarpRows = 16;  // a warpgroup's m64 products hold 16 rows in each of its warps
constexpr int kGroupRows = 64;
constexpr int kConsumers = kPrefillTileTokens / kGroupRows;
constexpr int kThreads = 128 * (1 + kConsumers);
// Slots per step: 128 rather than 64, so that an S product's k-step reads 6 kB of shared memory
// per 64 clocks of the tensor cores rather than 4 kB per 32 (their limit of 128 bytes a clock).
constexpr int kSlots = 128;
// Stages of keys and of values: keys three, as a step's keys are needed a step before its values
// (its S product comes before its PV product), and the producer copies them a step ahead.
constexpr int kKeyStages = 3;
constexpr int kValueStages = 2;
// 128 x 80 + 256 x 208 registers: within the 384 x 168 that the launch bounds give the CTA.
constexpr int kProducerRegisters = 80;
constexpr int kConsumerRegisters = 208;

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
  return (kPrefillTileTokens + (kKeyStages + kValueStages) * kSlots) * kOperandCols<D> *
             static_cast<int>(sizeof(uint16_t)) +
         1024;
}

// The position a slot past the segment's end copies: after every query.
__device__ const int32_t kNoPosition = INT_MAX;

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
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
  uint16_t* v_tiles = k_tiles + kKeyStages * kSlots * kOC;
  __shared__ int32_t slot_pos[kKeyStages][kSlots];
  __shared__ int32_t query_pos[kPrefillTileTokens];
  __shared__ int32_t max_query_pos;
  __shared__ int32_t last_visible_slot;
  // A stage's keys (and positions) and its values: copied (full), and read by both consumers
  // (empty).
  __shared__ uint64_t keys_full[kKeyStages], keys_empty[kKeyStages], values_full[kValueStages],
      values_empty[kValueStages];

  // Later tiles of a sequence see more slots: they start first, every head's before the next
  // tile's, so that the grid's last wave is of short ones (with the heads outermost, the last
  // head's long tiles started near the end and ran on alone).
  const int tile = gridDim.y - 1 - blockIdx.y;
  const int first = a.tiles[2 * tile];
  const int count = a.tiles[2 * tile + 1];
  const int h = blockIdx.x;
  const int group = a.num_q_heads / kv.num_kv_heads;
  const int segment = a.sequences[first] * kv.num_kv_heads + h / group;
  const int32_t* table = kv.page_ids + kv.page_offsets[segment];
  const int length = kv.lengths[segment];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warpgroup = warp / 4;

  if (threadIdx.x == 0) {
    max_query_pos = INT_MIN;
    last_visible_slot = -1;
    // The producer's threads, and the consumers'.
    for (int s = 0; s < kKeyStages; ++s) {
      mbarrier_init(shared_address(&keys_full[s]), 128);
      mbarrier_init(shared_address(&keys_empty[s]), 128 * kConsumers);
    }
    for (int s = 0; s < kValueStages; ++s) {
      mbarrier_init(shared_address(&values_full[s]), 128);
      mbarrier_init(shared_address(&values_empty[s]), 128 * kConsumers);
    }
    // The initialised barriers seen by the copies' asynchronous arrivals too.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  {
    // All of a thread's loads of Q before its stores, so that their latencies overlap.
    constexpr int kQLoads = (kPrefillTileTokens * kChunks + kThreads - 1) / kThreads;
    uint4 packed[kQLoads];
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int c = threadIdx.x + k * kThreads, r = c / kChunks, chunk = c % kChunks;
      packed[k] = make_uint4(0, 0, 0, 0);
      if (r < count) {
        packed[k] = *reinterpret_cast<const uint4*>(
            a.q + (static_cast<int64_t>(first + r) * a.num_q_heads + h) * D + chunk * 8);
      }
    }
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int c = threadIdx.x + k * kThreads, r = c / kChunks, chunk = c % kChunks;
      if (r < kPrefillTileTokens) {
        *reinterpret_cast<uint4*>(q_tile + operand_at<kPrefillTileTokens>(r, chunk)) = packed[k];
      }
    }
  }
  // head_dim 32's zero columns of Q and of every stage of K, which no copy writes.
  constexpr int kPadChunks = kOC / 8 - kChunks;
  if constexpr (kPadChunks > 0) {
    for (int c = threadIdx.x; c < (kPrefillTileTokens + kKeyStages * kSlots) * kPadChunks;
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
  // segment's scan took 16 per thread). Its page ids, then its positions, are read kScanBatch at
  // a time, so that their latencies overlap (one slot at a time, the scan was two L2 round trips
  // a slot).
  {
    constexpr int kScanBatch = 8;
    int last = -1;
    const int page_step = kThreads / kv.page_size, row_step = kThreads % kv.page_size;
    int page = threadIdx.x / kv.page_size, row = threadIdx.x % kv.page_size;
    for (int batch = threadIdx.x; batch < length; batch += kScanBatch * kThreads) {
      int64_t at[kScanBatch];
#pragma unroll
      for (int k = 0; k < kScanBatch; ++k) {
        at[k] = -1;
        if (batch + k * kThreads < length) {
          at[k] = static_cast<int64_t>(table[page]) * kv.page_size + row;
        }
        page += page_step;
        row += row_step;
        if (row >= kv.page_size) {
          row -= kv.page_size;
          ++page;
        }
      }
#pragma unroll
      for (int k = 0; k < kScanBatch; ++k) {
        if (at[k] >= 0 && kv.meta[at[k]].position <= max_query_pos) last = batch + k * kThreads;
      }
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) atomicMax(&last_visible_slot, last);
  }
  fence_proxy_async_shared();  // Q's stores seen by the tensor cores' reads
  __syncthreads();
  const int steps = (last_visible_slot + kSlots) / kSlots;

  if (warpgroup == 0) {
    // The producer: two threads a slot, kPasses slots a step, each thread copying half of its
    // slot's key and value chunks. A thread's chunks are two apart, so that each copy instruction
    // reads whole 32-byte sectors of its slots' rows, and odd slots take their chunks in the other
    // order, so that a quarter-warp's slots write distinct banks. A thread's slots are 64 apart:
    // its page and row step along with them, with no division per slot (a division a copy made the
    // producer the kernel's limit).
    registers_down<kProducerRegisters>();
    constexpr int kSlotThreads = 2;
    constexpr int kPassSlots = 128 / kSlotThreads;
    constexpr int kPasses = kSlots / kPassSlots;
    constexpr int kSlotChunks = kChunks / kSlotThreads;
    static_assert(kChunks % kSlotThreads == 0 && kSlots % kPassSlots == 0);
    const int copy_slot = threadIdx.x / kSlotThreads, copy_part = threadIdx.x % kSlotThreads;
    const int page_step = kPassSlots / kv.page_size, row_step = kPassSlots % kv.page_size;
    int page_index = copy_slot / kv.page_size, row = copy_slot % kv.page_size;
    // The pages of a step's slots: looked up for its keys, used again for its values.
    struct Slots {
      int32_t pages[kPasses];
      int rows[kPasses];
    };
    const auto look_up = [&](int step, Slots& at) {
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const bool valid = step * kSlots + pass * kPassSlots + copy_slot < length;
        at.pages[pass] = valid ? table[page_index] : 0;
        at.rows[pass] = row;
        page_index += page_step;
        row += row_step;
        if (row >= kv.page_size) {
          row -= kv.page_size;
          ++page_index;
        }
      }
    };
    const auto copy = [&](int step, const Slots& at, uint16_t* tiles, int stage, bool keys) {
      const int64_t value_offset = keys ? 0 : static_cast<int64_t>(kv.page_size) * D;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int stage_slot = pass * kPassSlots + copy_slot;
        const bool valid = step * kSlots + stage_slot < length;
        const uint16_t* key =
            kv.pool + (static_cast<int64_t>(at.pages[pass]) * 2 * kv.page_size + at.rows[pass]) * D;
#pragma unroll
        for (int j = 0; j < kSlotChunks; ++j) {
          const int chunk = ((j ^ (copy_slot % 2)) % kSlotChunks) * kSlotThreads + copy_part;
          cp_async_16(
              shared_address(tiles + stage * kSlots * kOC + operand_at<kSlots>(stage_slot, chunk)),
              key + value_offset + chunk * 8, valid);
        }
        if (keys && copy_part == 0) {
          cp_async_4(
              shared_address(&slot_pos[stage][stage_slot]),
              valid ? &kv.meta[static_cast<int64_t>(at.pages[pass]) * kv.page_size + at.rows[pass]]
                           .position
                    : &kNoPosition);
        }
      }
    };
    // Keys a step ahead of values: turn i copies the keys of step i and the values of step i - 1.
    // A stage's n-th fill waits for the consumers' release of its fill n - 1.
    Slots key_slots{}, value_slots{};
    for (int turn = 0; turn <= steps; ++turn) {
      value_slots = key_slots;
      if (turn < steps) {
        look_up(turn, key_slots);
        const int stage = turn % kKeyStages;
        if (turn >= kKeyStages) {
          mbarrier_wait(shared_address(&keys_empty[stage]), (turn / kKeyStages - 1) & 1);
        }
        copy(turn, key_slots, k_tiles, stage, true);
        mbarrier_arrive_after_copies(shared_address(&keys_full[stage]));
      }
      if (turn > 0) {
        const int step = turn - 1, stage = step % kValueStages;
        if (step >= kValueStages) {
          mbarrier_wait(shared_address(&values_empty[stage]), (step / kValueStages - 1) & 1);
        }
        copy(step, value_slots, v_tiles, stage, false);
        mbarrier_arrive_after_copies(shared_address(&values_full[stage]));
      }
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
  static_assert(kSlots == 128, "each lane reads four slots' positions");
  const int group_max = __reduce_max_sync(  // INT_MIN past the tile's tokens
      0xffffffffu,
      max(query_pos[consumer * kGroupRows + lane], query_pos[consumer * kGroupRows + lane + 32]));
  // Descriptors of the warpgroup's Q rows and of the first stages of K and V, advanced by an add to
  // a stage and a k-step.
  const uint64_t q_desc =
      wgmma_descriptor(shared_address(q_tile + consumer * kGroupRows * kBlockCols));
  const uint64_t k_desc = wgmma_descriptor(shared_address(k_tiles));
  const uint64_t v_desc =
      wgmma_descriptor_n_major(shared_address(v_tiles), kSlots * kBlockCols * 2);

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

  // The consumers take turns at issuing their products (named barrier 1 + c is consumer c's turn:
  // its own 128 threads wait there for the other's 128 to arrive), so that one's softmax runs
  // while the other's products do, rather than both waiting on the tensor cores at once.
  // Consumer 1 gives consumer 0 the first turn.
  constexpr int kTurnThreads = 128 * kConsumers;
  static_assert(kConsumers == 2, "turns alternate between two consumers");
  const auto take_turn = [&] { named_barrier_sync<kTurnThreads>(1 + consumer); };
  const auto pass_turn = [&] {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(2 - consumer), "n"(kTurnThreads) : "memory");
  };
  // Waits for the step's keys and issues its S product (whether or not the warpgroup sees them,
  // so that every step's products are issued and waited for the same way: with the products
  // issued under conditions, ptxas serialised them).
  const auto issue_s = [&](int step) {
    const int stage = step % kKeyStages;
    mbarrier_wait(shared_address(&keys_full[stage]), (step / kKeyStages) & 1);
    fence_proxy_async_shared();  // the copies (keys, and values waited for) seen by the MMA
    take_turn();
    const uint64_t k_stage = wgmma_descriptor_advanced(k_desc, stage * kSlots * kOC * 2);
    wgmma_fence_operands(output);
    wgmma_fence_operands(p_words);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kOC / 16; ++ks) {
      // k-step ks: column block ks / 4, 32 bytes into its rows per step within it.
      const uint64_t q_step = wgmma_descriptor_advanced(
          q_desc, (ks / 4) * kPrefillTileTokens * kBlockCols * 2 + (ks % 4) * 32);
      const uint64_t k_step =
          wgmma_descriptor_advanced(k_stage, (ks / 4) * kSlots * kBlockCols * 2 + (ks % 4) * 32);
      if (ks == 0) {
        wgmma_m64n128k16_bf16<false>(scores, q_step, k_step);
      } else {
        wgmma_m64n128k16_bf16<true>(scores, q_step, k_step);
      }
    }
    wgmma_commit();
  };
  // Waits for the values of `step`, before the next S product's wait and proxy fence (a wait
  // between the products' fence and the PV product made ptxas fence again).
  const auto wait_values = [&](int step) {
    mbarrier_wait(shared_address(&values_full[step % kValueStages]), (step / kValueStages) & 1);
  };
  // O += P V over the values of `step`, issued and committed.
  const auto issue_pv = [&](int step) {
    const uint64_t v_stage =
        wgmma_descriptor_advanced(v_desc, (step % kValueStages) * kSlots * kOC * 2);
#pragma unroll
    for (int kk = 0; kk < kSlots / 16; ++kk) {
      // k-step kk: slots 16 kk .. 16 kk + 15, two of V's 8-row atoms.
      const uint64_t v_step = wgmma_descriptor_advanced(v_stage, kk * 16 * kBlockCols * 2);
      if constexpr (kOC == 128) {
        wgmma_m64n128k16_bf16_n_major(output, p[kk], v_step);
      } else {
        wgmma_m64n64k16_bf16_n_major(output, p[kk], v_step);
      }
    }
    wgmma_commit();
  };
  // The step's softmax, its S product waited for: masks, the rows' new maxima (their correction
  // for O and l in `correction`), exponents into s and their sums into l; whether any row's
  // maximum grew. A step the warpgroup does not see leaves everything as it was.
  float correction[kRows];
  const auto softmax = [&](int step, bool& visible) {
    const int stage = step % kKeyStages;
    // Slots all after every query of the warpgroup (the causal upper triangle) cost it no
    // arithmetic; slots all before every query of the warp (below the diagonal) need no mask.
    int lowest = INT_MAX, highest = INT_MIN;
#pragma unroll
    for (int k = 0; k < kSlots / 32; ++k) {
      lowest = min(lowest, slot_pos[stage][lane + 32 * k]);
      highest = max(highest, slot_pos[stage][lane + 32 * k]);
    }
    visible = __any_sync(0xffffffffu, lowest <= group_max);
    const bool unmasked = __all_sync(0xffffffffu, highest <= warp_min);
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

  // The thread's release of a step's keys or values.
  const auto release_keys = [&](int step) {
    mbarrier_arrive(shared_address(&keys_empty[step % kKeyStages]));
  };
  const auto release_values = [&](int step) {
    mbarrier_arrive(shared_address(&values_empty[step % kValueStages]));
  };
  if (steps > 0) {
    if (consumer == 1) pass_turn();
    issue_s(0);
    pass_turn();
    wgmma_wait<0>();
    wgmma_fence_operands(scores);
    bool visible = false;
    const bool grew = softmax(0, visible);
    release_keys(0);
    next_p(visible, grew);
    for (int step = 1; step < steps; ++step) {
      wait_values(step - 1);
      issue_s(step);
      issue_pv(step - 1);
      pass_turn();
      wgmma_wait<1>();
      wgmma_fence_operands(scores);
      const bool step_grew = softmax(step, visible);
      release_keys(step);
      wgmma_wait<0>();
      wgmma_fence_operands(output);
      wgmma_fence_operands(p_words);
      release_values(step - 1);
      next_p(visible, step_grew);
    }
    wait_values(steps - 1);
    fence_proxy_async_shared();
    wgmma_fence_operands(output);
    wgmma_fence_operands(p_words);
    take_turn();
    wgmma_fence();
    issue_pv(steps - 1);
    // Consumer 1's last turn is given to no one: consumer 0 takes no more.
    if (consumer == 0) pass_turn();
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
  // The tiles are the grid's second dimension.
  constexpr int kMaxTiles = 65535;
  if (a.num_tiles > kMaxTiles) {
    fail(ErrorKind::kUnsupported, "prefill_attention: {} tiles of queries in one step (at most {})",
         a.num_tiles, kMaxTiles);
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
    const dim3 grid(static_cast<unsigned>(a.num_q_heads), static_cast<unsigned>(a.num_tiles));
    prefill_attention_kernel<D><<<grid, kThreads, bytes, stream>>>(kv, a, scale_log2);
  });
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
