// Routed experts without the host: the step's (token, expert) pairs sorted by expert on the
// device and cut into groups, each touched expert's weights read once per group of its tokens by a
// grouped product on the tensor cores (a GEMV for a one-token step), and the gated sum per token in
// ascending expert order (as the CPU adds them).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

constexpr int kSortThreads = 1024;
constexpr int kSortWarps = kSortThreads / 32;
constexpr int kSortRoundsAhead = 8;  // rounds of a warp's experts loaded before any is placed
constexpr int kSortCtaPairs = 4096;  // pairs per CTA at least, where a step has several
constexpr int kSortMaxCtas = 32;

// A stable counting sort of the pairs by expert over gridDim.x CTAs, CTA b taking the b-th of
// gridDim.x runs of consecutive pairs and its warp w the w-th of kSortWarps runs of the CTA's. The
// warps count their runs' pairs per expert; with more than one CTA, sort_count_kernel has stored
// each CTA's counts (`cta_counts`, [CTA][expert]) and a CTA's first slot for an expert is the
// pairs of lower experts plus those of the expert in the CTAs before it. A scan over (expert, warp)
// gives each warp its first slot for each expert; each warp then places its run 32 pairs a round,
// a pair's slot being its warp's next slot for its expert plus the pairs of that expert before it
// in the round (matched within the warp). The rounds need no CTA barrier, and a warp loads
// kSortRoundsAhead rounds' experts before counting or placing any. Each expert's pairs are cut into
// groups of at most group_tokens (written by CTA 0).
struct SortRuns {
  int begin = 0, end = 0;  // the warp's run
};
__device__ __forceinline__ SortRuns sort_runs(int pairs, int warp) {
  const int cta_run = (pairs + gridDim.x - 1) / gridDim.x;
  const int cta_begin = min(pairs, static_cast<int>(blockIdx.x) * cta_run);
  const int cta_end = min(pairs, cta_begin + cta_run);
  const int run = (cta_end - cta_begin + kSortWarps - 1) / kSortWarps;
  SortRuns r;
  r.begin = min(cta_end, cta_begin + warp * run);
  r.end = min(cta_end, r.begin + run);
  return r;
}
// The experts of the kSortRoundsAhead rounds from `base` (-1 past the run), all loads issued
// before any is used.
__device__ __forceinline__ void load_sort_rounds(const int32_t* experts, int base, int run_end,
                                                 int lane, int (&ahead)[kSortRoundsAhead]) {
#pragma unroll
  for (int r = 0; r < kSortRoundsAhead; ++r) {
    const int j = base + r * 32 + lane;
    ahead[r] = j < run_end ? experts[j] : -1;
  }
}
// Each warp's pairs per expert into warp_counts[warp][expert] (zeroed first).
__device__ __forceinline__ void count_sort_runs(
    const int32_t* experts, int pairs, int num_experts,
    int32_t (&warp_counts)[kSortWarps][kMaxGroupedExperts]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kSortWarps * num_experts; i += kSortThreads) {
    warp_counts[i / num_experts][i % num_experts] = 0;
  }
  __syncthreads();
  const SortRuns runs = sort_runs(pairs, warp);
  for (int base = runs.begin; base < runs.end; base += 32 * kSortRoundsAhead) {
    int ahead[kSortRoundsAhead];
    load_sort_rounds(experts, base, runs.end, lane, ahead);
#pragma unroll
    for (int r = 0; r < kSortRoundsAhead; ++r) {
      const int e = ahead[r];
      const uint32_t same = __match_any_sync(0xffffffffu, e);
      if (e >= 0 && lane == __ffs(same) - 1) warp_counts[warp][e] += __popc(same);
      __syncwarp();  // the count is in before another lane adds to it
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kSortThreads)
    sort_count_kernel(const int32_t* experts, int n, int k, int num_experts, int32_t* cta_counts) {
  follow_prior_grid();
  __shared__ int32_t warp_counts[kSortWarps][kMaxGroupedExperts];
  count_sort_runs(experts, n * k, num_experts, warp_counts);
  for (int e = threadIdx.x; e < num_experts; e += kSortThreads) {
    int count = 0;
    for (int w = 0; w < kSortWarps; ++w) count += warp_counts[w][e];
    cta_counts[blockIdx.x * num_experts + e] = count;
  }
}

__global__ void __launch_bounds__(kSortThreads)
    sort_pairs_kernel(const int32_t* experts, const float* gates, int n, int k, int num_experts,
                      int group_tokens, const int32_t* cta_counts, MoePairs p) {
  follow_prior_grid();
  // Pairs per (warp, expert), then each warp's next slot for the expert.
  __shared__ int32_t warp_next[kSortWarps][kMaxGroupedExperts];
  // Each expert's pairs in all CTAs, then its first slot in this CTA; with several CTAs, the
  // expert's pairs in the CTAs before this one.
  __shared__ int32_t next[kMaxGroupedExperts];
  __shared__ int32_t before[kMaxGroupedExperts];
  const int pairs = n * k;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  count_sort_runs(experts, pairs, num_experts, warp_next);
  for (int e = threadIdx.x; e < num_experts; e += kSortThreads) {
    int count = 0, earlier = 0;
    if (gridDim.x == 1) {
      for (int w = 0; w < kSortWarps; ++w) count += warp_next[w][e];
    } else {
      for (int b = 0; b < static_cast<int>(gridDim.x); ++b) {
        const int c = cta_counts[b * num_experts + e];
        count += c;
        if (b < static_cast<int>(blockIdx.x)) earlier += c;
      }
    }
    next[e] = count;
    before[e] = earlier;
  }
  __syncthreads();
  // Exclusive scans of the counts and of the groups over the experts, by the first warp: each
  // lane scans a contiguous run of experts, then the runs' sums are scanned across the warp.
  if (warp == 0) {
    const int run_experts = (num_experts + 31) / 32;
    const int begin = min(num_experts, lane * run_experts);
    const int end = min(num_experts, begin + run_experts);
    const auto groups_of = [&](int count) { return (count + group_tokens - 1) / group_tokens; };
    int count = 0, groups = 0;
    for (int e = begin; e < end; ++e) {
      count += next[e];
      groups += groups_of(next[e]);
    }
    int count_before = count, groups_before = groups;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int c = __shfl_up_sync(0xffffffffu, count_before, offset);
      const int g = __shfl_up_sync(0xffffffffu, groups_before, offset);
      if (lane >= offset) {
        count_before += c;
        groups_before += g;
      }
    }
    count_before -= count;
    groups_before -= groups;
    const bool write_groups = blockIdx.x == 0;
    for (int e = begin; e < end; ++e) {
      const int c = next[e];
      next[e] = count_before + before[e];
      if (write_groups) {
        for (int i = 0; i < groups_of(c); ++i) {
          p.group_expert[groups_before] = e;
          p.group_first[groups_before++] = count_before + i * group_tokens;
        }
      }
      count_before += c;
    }
    if (write_groups && lane == 31) {
      p.group_first[groups_before] = pairs;
      *p.num_groups = groups_before;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += kSortThreads) {
    int slot = next[e];
    for (int w = 0; w < kSortWarps; ++w) {
      const int count = warp_next[w][e];
      warp_next[w][e] = slot;
      slot += count;
    }
  }
  __syncthreads();
  const SortRuns runs = sort_runs(pairs, warp);
  for (int base = runs.begin; base < runs.end; base += 32 * kSortRoundsAhead) {
    int ahead[kSortRoundsAhead];
    load_sort_rounds(experts, base, runs.end, lane, ahead);
#pragma unroll
    for (int r = 0; r < kSortRoundsAhead; ++r) {
      const int j = base + r * 32 + lane, e = ahead[r];
      const uint32_t same = __match_any_sync(0xffffffffu, e);
      if (e >= 0) {
        const int slot = warp_next[warp][e] + __popc(same & ((1u << lane) - 1));
        const int t = j / k;
        int order = 0;  // the token's experts below e
        for (int i = t * k; i < (t + 1) * k; ++i) order += experts[i] < e;
        p.token[slot] = t;
        p.gate[slot] = gates[j];
        p.expert[slot] = e;
        p.token_pairs[t * k + order] = slot;
      }
      __syncwarp();  // every lane has its slot before the expert's next one moves
      if (e >= 0 && lane == __ffs(same) - 1) warp_next[warp][e] += __popc(same);
      __syncwarp();
    }
  }
}

// Where output row r of input row t goes, the product's input rows being pairs [first, first +
// count) (dense: rows 0 .. count).
__device__ __forceinline__ float* output_address(const GroupedGemm& g, int first, int count, int t,
                                                 int r) {
  if (g.first_block_rows == 0) return g.out + static_cast<int64_t>(first + t) * g.out_rows + r;
  if (r < g.first_block_rows) return g.out + static_cast<int64_t>(t) * g.first_block_rows + r;
  const int block = (r - g.first_block_rows) / g.block_rows;
  const int local = r - g.first_block_rows - block * g.block_rows;
  return g.out + static_cast<int64_t>(count) * (g.first_block_rows + block * g.block_rows) +
         static_cast<int64_t>(t) * g.block_rows + local;
}

constexpr int kCols = 64;  // input columns per pipeline stage

// A step's shape of the grouped product for at most Tokens (16 or kMaxGroupedTokens) pairs per
// group: the warps' layout, the weight tile and the input tile of a stage, and the stages. A
// GEMV-like product is bound by the bytes in flight, so few tokens take deep pipelines (six stages,
// two CTAs per multiprocessor); 64 tokens take three, so that three CTAs fit on a multiprocessor:
// as many bytes in flight as four stages of two CTAs, and half as many warps again to keep the
// tensor cores fed. Each warp holds the sums of 16 weight rows and every token, multiplied with
// mma.sync from fragments it loads.
template <int Tokens>
struct GroupedGemmShape {
  static constexpr int kWarps = 8;
  static constexpr int kRows = 16 * kWarps;  // weight rows per CTA
  static constexpr int kWarpRows = kRows / kWarps;
  static constexpr int kStageElements = (kRows + Tokens) * kCols;
  static constexpr int kStages = Tokens <= 16 ? 6 : 3;
  static constexpr int kSharedBytes = kStages * kStageElements * static_cast<int>(sizeof(uint16_t));
};

// Wide groups (kWideGroupTokens pairs: prompts, large decode batches) take Hopper's warpgroup MMA
// (mma.sync needed as many fragment loads and instructions as the tensor cores had work): each of
// kWideConsumers warpgroups multiplies 64 weight rows with the 128 tokens straight from shared
// memory, 256 rows per CTA so that a stage's input tile serves them all (L2 was 71% busy at 128
// rows per CTA). A producer warpgroup copies the stages and meets the consumers at mbarriers (a
// stage full, a stage empty) instead of a CTA barrier every step: every stage is in flight while
// the consumers multiply, and no warpgroup waits for the slowest one's products.
constexpr int kWideRows = 256;
constexpr int kWideConsumers = kWideRows / 64;
constexpr int kWideThreads = 128 * (1 + kWideConsumers);
constexpr int kWideStages = 4;
// The launch's 96 registers a thread (65536 / kWideThreads, in multiples of 8), some of the
// producer's given to the consumers, whose 64 sums and epilogue spilled in 96.
constexpr int kWideProducerRegisters = 64;
constexpr int kWideConsumerRegisters = 104;
static_assert(128 * kWideProducerRegisters + 128 * kWideConsumers * kWideConsumerRegisters <=
              kWideThreads * (65536 / kWideThreads / 8 * 8));
constexpr int kWideStageElements = (kWideRows + kWideGroupTokens) * kCols;
constexpr int kWideSharedBytes =
    kWideStages * kWideStageElements * static_cast<int>(sizeof(uint16_t));
constexpr int kChunks = kCols / 8;  // 16-byte chunks of a tile row

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][kCols] bf16 tile, XOR-swizzled
// so that the eight row addresses of an ldmatrix fall in distinct banks (the warpgroup MMA's
// 128-byte swizzle).
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kCols + ((chunk ^ (row % 8)) * 8);
}

// Stores sum v of output row r and the group's input row t into g.out, adding it where the
// product's columns are split over CTAs.
__device__ __forceinline__ void store_sum(const GroupedGemm& g, int first, int count, int t, int r,
                                          float v, bool split) {
  float* out = output_address(g, first, count, t, r);
  if (split) {
    atomicAdd(out, v);
  } else {
    *out = v;
  }
}

// grid: (row tiles, groups at most, column splits). The CTA multiplies kRows rows of its expert's
// weights with every input row of that expert's pairs (at most Tokens) on the tensor cores, weights
// as the M side (the "swap AB" of a skinny product), so each weight byte is read once whatever the
// number of tokens; copies run kStages - 1 column steps ahead.
template <int Tokens>
__global__ void __launch_bounds__(GroupedGemmShape<Tokens>::kWarps * 32, 1)
    grouped_gemm_kernel(const GroupedGemm g, const MoePairs p, int split_cols) {
  follow_prior_grid();
  using Shape = GroupedGemmShape<Tokens>;
  constexpr int kWarps = Shape::kWarps;
  constexpr int kRows = Shape::kRows;
  constexpr int kStages = Shape::kStages;
  constexpr int kMTiles = Shape::kWarpRows / 16;
  constexpr int kNPairs = Tokens / 16;  // 16-token halves of the warp's ldmatrix
  const bool dense = g.dense != nullptr;
  const int group = blockIdx.y, row_tile = blockIdx.x;
  if (!dense && group >= *p.num_groups) return;
  const int first = dense ? 0 : p.group_first[group];
  const int count = dense ? g.dense_rows : p.group_first[group + 1] - first;
  const int col_begin = blockIdx.z * split_cols;
  const int col_end = min(g.in_cols, col_begin + split_cols);
  if (col_begin >= col_end) return;
  extern __shared__ __align__(1024) uint4 shared_raw[];
  uint16_t* tiles = reinterpret_cast<uint16_t*>(shared_raw);
  const uint16_t* w = dense ? g.dense : g.weights[p.group_expert[group]];
  const int row0 = row_tile * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * Shape::kWarpRows;
  const int input_rows = (count + 15) / 16 * 16;  // what the mma reads: the rest is zeroed

  // Each thread copies the same 16-byte chunk of rows kCopyRows apart at every stage: their element
  // offsets are found once, so that a stage's copies cost a few instructions each (address
  // arithmetic per copy held the issue slots busy).
  constexpr int kCopyRows = kWarps * 32 / kChunks;
  constexpr int kWeightCopies = kRows / kCopyRows;
  constexpr int kInputCopies = (Tokens + kCopyRows - 1) / kCopyRows;
  const int chunk = threadIdx.x % kChunks, copy_row = threadIdx.x / kChunks;
  uint32_t weight_at[kWeightCopies], input_at[kInputCopies];
  uint32_t has_row = 0;  // bit j: weight copy j has a row; bit kWeightCopies + j: input copy j
#pragma unroll
  for (int j = 0; j < kWeightCopies; ++j) {
    const int wr = row0 + copy_row + j * kCopyRows;
    weight_at[j] = wr < g.out_rows ? static_cast<uint32_t>(wr) * g.in_cols : 0;
    if (wr < g.out_rows) has_row |= 1u << j;
  }
#pragma unroll
  for (int j = 0; j < kInputCopies; ++j) {
    const int t = copy_row + j * kCopyRows;
    const int input_row = t >= count ? 0 : g.input_is_token ? p.token[first + t] : first + t;
    input_at[j] = static_cast<uint32_t>(input_row) * g.in_cols;
    if (t < count) has_row |= 1u << (kWeightCopies + j);
  }
  const int shared_at = swizzled(copy_row, chunk);  // plus kCopyRows rows per copy

  const auto load = [&](int stage, int c0) {
    uint16_t* w_tile = tiles + stage * Shape::kStageElements;
    uint16_t* x_tile = w_tile + kRows * kCols;
    const int col = c0 + chunk * 8;
    const bool in_columns = col < col_end;
#pragma unroll
    for (int j = 0; j < kWeightCopies; ++j) {
      const bool valid = in_columns && (has_row >> j & 1u);
      cp_async_16(shared_address(w_tile + shared_at + j * kCopyRows * kCols),
                  w + (valid ? weight_at[j] + col : 0), valid);
    }
#pragma unroll
    for (int j = 0; j < kInputCopies; ++j) {
      // Rows from count to input_rows are zeroed; those after them are not read.
      if (copy_row + j * kCopyRows >= input_rows) break;
      const bool valid = in_columns && (has_row >> (kWeightCopies + j) & 1u);
      cp_async_16(shared_address(x_tile + shared_at + j * kCopyRows * kCols),
                  g.input + (valid ? input_at[j] + col : 0), valid);
    }
  };

  float acc[kMTiles][Tokens / 8][4] = {};
  const int steps = (col_end - col_begin + kCols - 1) / kCols;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load(s, col_begin + s * kCols);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int ahead = step + kStages - 1;
    if (ahead < steps) load(ahead % kStages, col_begin + ahead * kCols);
    cp_async_commit();
    const uint16_t* w_tile = tiles + (step % kStages) * Shape::kStageElements;
    const uint16_t* x_tile = w_tile + kRows * kCols;
#pragma unroll
    for (int ks = 0; ks < kCols / 16; ++ks) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        ldmatrix_x4(a[mt], shared_address(w_tile + swizzled(warp_row0 + mt * 16 + lane % 16,
                                                            ks * 2 + lane / 16)));
      }
#pragma unroll
      for (int np = 0; np < kNPairs; ++np) {
        const int token = np * 16;
        if (token >= input_rows) break;
        uint32_t b[4];
        ldmatrix_x4(b, shared_address(x_tile + swizzled(token + lane % 8 + (lane / 16) * 8,
                                                        ks * 2 + (lane / 8) % 2)));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_bf16_16816(acc[mt][2 * np], a[mt], b[0], b[1]);
          mma_bf16_16816(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait_all();

  const bool split = gridDim.z > 1;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Tokens / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = row0 + warp_row0 + mt * 16 + lane / 4 + (e / 2) * 8;
        const int t = nt * 8 + (lane % 4) * 2 + e % 2;
        if (r < g.out_rows && t < count) store_sum(g, first, count, t, r, acc[mt][nt][e], split);
      }
    }
  }
}

// Persistent: CTA b takes tiles b, b + gridDim.x, ... of (group, row tile, column split), groups
// fastest, so that an expert's groups run side by side and each weight tile is read from DRAM once
// for all of them however many groups the expert has. Where the input rows are the pairs' own (the
// down product: top_k rows a token, more than L2 holds in a prompt) a group's row tiles are
// fastest instead, so that its input rows are read from DRAM once too, not once a row tile, while
// an expert's groups still run side by side. The producer runs on into the next tile's
// stages while the consumers store the last one's sums, so no tile waits for its first copies.
// A SwiGLU tile takes kWideRows / 2 outputs: each warp's 16 tile rows are 8 gate rows and the up
// rows of the same outputs, so a thread holds both sums of an output (rows lane / 4 and lane / 4 +
// 8 of the MMA's fragment) and no float32 gate-and-up rows are written.
__global__ void __launch_bounds__(kWideThreads, 1)
    grouped_gemm_wide_kernel(const GroupedGemm g, const MoePairs p, int row_tiles, int splits,
                             int split_cols, bool row_tiles_fastest) {
  follow_prior_grid();
  extern __shared__ __align__(1024) uint4 shared_raw[];  // the 128-byte swizzle's atoms
  uint16_t* tiles = reinterpret_cast<uint16_t*>(shared_raw);
  __shared__ uint64_t full[kWideStages], empty[kWideStages];
  const bool dense = g.dense != nullptr;
  const int groups = dense ? 1 : *p.num_groups;
  const int num_tiles = groups * row_tiles * splits;
  const bool swiglu = g.swiglu_out != nullptr;
  const int half_rows = g.out_rows / 2;
  // Output rows a tile: half its rows with a SwiGLU (their gate and up rows).
  const int tile_outputs = swiglu ? kWideRows / 2 : kWideRows;
  struct Tile {
    int group, first, count, row0, col_begin, col_end, steps;
  };
  const auto tile_at = [&](int tile) {
    Tile t;
    const int split = tile / (groups * row_tiles), in_split = tile % (groups * row_tiles);
    const int group = row_tiles_fastest ? in_split / row_tiles : in_split % groups;
    const int row_tile = row_tiles_fastest ? in_split % row_tiles : in_split / groups;
    t.group = group;
    t.first = dense ? 0 : p.group_first[group];
    t.count = dense ? g.dense_rows : p.group_first[group + 1] - t.first;
    t.row0 = row_tile * tile_outputs;
    t.col_begin = split * split_cols;
    t.col_end = min(g.in_cols, t.col_begin + split_cols);
    t.steps = (max(t.col_end - t.col_begin, 0) + kCols - 1) / kCols;
    return t;
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kWideStages; ++s) {
      mbarrier_init(shared_address(&full[s]), 128);  // the producer's threads
      mbarrier_init(shared_address(&empty[s]), 128 * kWideConsumers);
    }
    // The initialised barriers seen by the copies' asynchronous arrivals too.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    registers_down<kWideProducerRegisters>();
    // The producer: each thread copies the same 16-byte chunk of tile rows copy_row + kCopyRows j
    // at every stage. Those rows' weight rows are evenly spaced (every 8 rows of the gate or the
    // up half with a SwiGLU, every kCopyRows rows else); the input rows' offsets are found once a
    // tile.
    constexpr int kCopyRows = 128 / kChunks;
    constexpr int kWeightCopies = kWideRows / kCopyRows;
    constexpr int kInputCopies = kWideGroupTokens / kCopyRows;
    static_assert(kCopyRows == 16, "a thread's tile rows are the same row of each warp's 16");
    const int chunk = threadIdx.x % kChunks, copy_row = threadIdx.x / kChunks;
    const int shared_at = swizzled(copy_row, chunk);  // plus kCopyRows rows per copy
    const int out_step = swiglu ? 8 : kCopyRows;      // output rows between a thread's copies
    const int out_offset = swiglu ? copy_row % 8 : copy_row;
    const int half_offset = swiglu && copy_row >= 8 ? half_rows : 0;
    const int out_limit = swiglu ? half_rows : g.out_rows;
    int it = 0;  // stages filled so far, over all of the CTA's tiles
    for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
      const Tile t = tile_at(tile);
      const uint16_t* w = dense ? g.dense : g.weights[p.group_expert[t.group]];
      uint32_t input_at[kInputCopies];
      uint32_t has_row = 0;  // bit j: weight copy j has a row; bit kWeightCopies + j: input copy j
#pragma unroll
      for (int j = 0; j < kWeightCopies; ++j) {
        if (t.row0 + out_offset + j * out_step < out_limit) has_row |= 1u << j;
      }
#pragma unroll
      for (int j = 0; j < kInputCopies; ++j) {
        const int r = copy_row + j * kCopyRows;
        const int input_row = r >= t.count       ? 0
                              : g.input_is_token ? p.token[t.first + r]
                                                 : t.first + r;
        input_at[j] = static_cast<uint32_t>(input_row) * g.in_cols;
        if (r < t.count) has_row |= 1u << (kWeightCopies + j);
      }
      const uint32_t weight_at =
          static_cast<uint32_t>(t.row0 + out_offset + half_offset) * g.in_cols;
      const uint32_t weight_step = static_cast<uint32_t>(out_step) * g.in_cols;
      for (int step = 0; step < t.steps; ++step, ++it) {
        const int stage = it % kWideStages;
        if (it >= kWideStages) {
          mbarrier_wait(shared_address(&empty[stage]), (it / kWideStages - 1) & 1);
        }
        uint16_t* w_tile = tiles + stage * kWideStageElements;
        uint16_t* x_tile = w_tile + kWideRows * kCols;
        const int col = t.col_begin + step * kCols + chunk * 8;
        const bool in_columns = col < t.col_end;
#pragma unroll
        for (int j = 0; j < kWeightCopies; ++j) {
          const bool valid = in_columns && (has_row >> j & 1u);
          cp_async_16(shared_address(w_tile + shared_at + j * kCopyRows * kCols),
                      w + (valid ? weight_at + j * weight_step + col : 0), valid);
        }
#pragma unroll
        for (int j = 0; j < kInputCopies; ++j) {
          // Rows past count are zeroed: the warpgroup MMA reads every row, and zeroed rows keep
          // its sums finite.
          const bool valid = in_columns && (has_row >> (kWeightCopies + j) & 1u);
          cp_async_16(shared_address(x_tile + shared_at + j * kCopyRows * kCols),
                      g.input + (valid ? input_at[j] + col : 0), valid);
        }
        mbarrier_arrive_after_copies(shared_address(&full[stage]));
      }
    }
    cp_async_wait_all();
    return;
  }

  // The consumers: warpgroup c multiplies tile rows [64 c, 64 c + 64).
  registers_up<kWideConsumerRegisters>();
  const int consumer_warp = threadIdx.x / 32 - 4, lane = threadIdx.x % 32;
  const int consumer = consumer_warp / 4;
  const bool split = splits > 1;
  // Descriptors of stage 0's weight rows and input rows, advanced by an add to a stage and k-step
  // (found from the address at every step, they took a third of the consumers' instructions).
  const uint64_t w_desc = wgmma_descriptor(shared_address(tiles + consumer * 64 * kCols));
  const uint64_t x_desc = wgmma_descriptor(shared_address(tiles + kWideRows * kCols));
  int it = 0;  // stages taken so far, over all of the CTA's tiles
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const Tile t = tile_at(tile);
    if (t.steps == 0) continue;
    float d[64] = {};
    for (int step = 0; step < t.steps; ++step, ++it) {
      const int stage = it % kWideStages;
      mbarrier_wait(shared_address(&full[stage]), (it / kWideStages) & 1);
      // The copies' generic-proxy writes seen by the MMA's asynchronous-proxy reads.
      fence_proxy_async_shared();
      const uint32_t stage_bytes = stage * kWideStageElements * 2;
      wgmma_fence_operands(d);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kCols / 16; ++ks) {
        wgmma_m64n128k16_bf16<true>(d, wgmma_descriptor_advanced(w_desc, stage_bytes + ks * 32),
                                    wgmma_descriptor_advanced(x_desc, stage_bytes + ks * 32));
      }
      wgmma_commit();
      wgmma_fence_operands(d);
      // Last step's products are done: their stage is free for the producer.
      wgmma_wait<1>();
      wgmma_fence_operands(d);
      if (step > 0) mbarrier_arrive(shared_address(&empty[(it - 1) % kWideStages]));
    }
    wgmma_wait<0>();
    wgmma_fence_operands(d);
    const int last_stage = (it - 1) % kWideStages;

    // Sum d[i] is of tile row 16 consumer_warp + lane / 4 + 8 (i % 4 / 2) and token i / 4 * 8 +
    // (lane % 4) * 2 + i % 2.
    if (!swiglu && g.out_bf16 == nullptr) {
      mbarrier_arrive(shared_address(&empty[last_stage]));
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int r = t.row0 + consumer_warp * 16 + lane / 4 + (i % 4 / 2) * 8;
        const int token = i / 4 * 8 + (lane % 4) * 2 + i % 2;
        if (r < g.out_rows && token < t.count)
          store_sum(g, t.first, t.count, token, r, d[i], split);
      }
      continue;
    }
    // bf16 rows: the warpgroup's rows of a token are consecutive in the output, so they are
    // gathered per token in shared memory (stmatrix, transposed) and stored 16 bytes at a time,
    // instead of one 2-byte store per sum. The last stage holds them, the warpgroup's 8 KB being
    // its own weight rows there, which no other warpgroup reads (another may still be
    // multiplying): a pass of all 128 tokens of the SwiGLU's 32 outputs or of 64 tokens of 64
    // rows.
    constexpr int kStagingBytes = 64 * kCols * static_cast<int>(sizeof(uint16_t));
    const int row_bytes = swiglu ? 64 : 128;  // a token's rows of the warpgroup
    const int chunks = row_bytes / 16;
    const int pass_tokens = kStagingBytes / row_bytes;
    const uint32_t staging =
        shared_address(tiles + last_stage * kWideStageElements) + consumer * kStagingBytes;
    // Byte offset of 16-byte chunk c of token row `token`, XOR-swizzled so that the eight rows an
    // stmatrix stores fall in distinct banks.
    const auto staged = [&](int token, int c) {
      return token * row_bytes + ((c ^ (token / (8 / chunks) % chunks)) * 16);
    };
    const int rows = swiglu ? half_rows : g.out_rows;
    uint16_t* out = swiglu ? g.swiglu_out : g.out_bf16;
    const int wg_row0 = t.row0 + consumer * chunks * 8;  // the warpgroup's first output row
    const int warp_in_group = consumer_warp % 4, matrix = lane / 8, matrix_row = lane % 8;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {  // unrolled: d is indexed by constants only
      if (pass * pass_tokens >= kWideGroupTokens) break;
      // Each stmatrix stores four 8 x 8 matrices (8 rows by 8 tokens, stored token-major).
      if (swiglu) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t r[4];
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const int nt = 4 * q + m;
            r[m] = static_cast<uint32_t>(swiglu_bf16(d[nt * 4], d[nt * 4 + 2])) |
                   static_cast<uint32_t>(swiglu_bf16(d[nt * 4 + 1], d[nt * 4 + 3])) << 16;
          }
          stmatrix_x4_trans(staging + staged((4 * q + matrix) * 8 + matrix_row, warp_in_group), r);
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int nt = 8 * pass + 2 * q;
          const uint32_t r[4] = {
              pack_bf16(d[nt * 4], d[nt * 4 + 1]), pack_bf16(d[nt * 4 + 2], d[nt * 4 + 3]),
              pack_bf16(d[nt * 4 + 4], d[nt * 4 + 5]), pack_bf16(d[nt * 4 + 6], d[nt * 4 + 7])};
          const int token = (nt + matrix / 2) * 8 + matrix_row - pass * pass_tokens;
          stmatrix_x4_trans(staging + staged(token, 2 * warp_in_group + matrix % 2), r);
        }
      }
      named_barrier_sync<128>(1 + consumer);
      for (int k = threadIdx.x % 128; k < pass_tokens * chunks; k += 128) {
        const int token = k / chunks, c = k % chunks;
        const int pair = pass * pass_tokens + token;
        if (pair >= t.count) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(staging + staged(token, c)));
        const int r0 = wg_row0 + c * 8;
        uint16_t* at = out + static_cast<int64_t>(t.first + pair) * rows + r0;
        if (rows % 8 == 0 && r0 + 8 <= rows) {
          *reinterpret_cast<uint4*>(at) = v;
        } else {
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (r0 + j < rows) at[j] = static_cast<uint16_t>(words[j / 2] >> (16 * (j % 2)));
          }
        }
      }
      // The rows are read before the next pass stores over them.
      named_barrier_sync<128>(1 + consumer);
    }
    mbarrier_arrive(shared_address(&empty[last_stage]));
  }
}

// A product whose groups have one input row each (batch-1 decode) is a GEMV, bound by the weight
// bytes in flight: each warp streams the weights of kWarpRows consecutive output rows (gate and up
// rows for a SwiGLU output) with 16-byte loads straight into registers, kGemvLoads of them per
// lane issued before any is used. One row per warp keeps enough warps reading with no long last
// wave; rows too short for a lane's loads go two to a warp. When the rows are too few to keep
// enough warps reading, `split` warps of a CTA share each row set, each reading every slices-th
// stretch of it, and add up in shared memory: nothing is zeroed or added atomically.
constexpr int kGemvWarps = 8;
constexpr int kGemvLoads = 8;

enum class GemvOutput {
  kOutputRows,  // g.out (output_address)
  kSwiglu,      // g.swiglu_out: bf16(silu(gate) * up) of the two halves of the weight rows
  kCombine,     // g.out row 0: the token's pairs gated and summed in ascending expert order
};

// Weight rows per output row, and column steps in flight for kWarpRows output rows per warp.
template <GemvOutput kOutput>
constexpr int kGemvHalves = kOutput == GemvOutput::kSwiglu ? 2 : 1;
template <GemvOutput kOutput, int kWarpRows>
constexpr int kGemvDepth = kGemvLoads / (kGemvHalves<kOutput> * kWarpRows);

struct GemvLaunch {
  GroupedGemm g;
  MoePairs p;
  int split = 1;           // warps per row set: 1, 2, 4 or 8
  int groups_per_set = 1;  // kCombine: the token's pairs, each read by split / groups_per_set warps
  int disabled_expert = -1;
};

// grid: (row tiles of kGemvWarps / split * kWarpRows output rows, groups; kCombine: 1); launched
// overlapping the kernel before it. A dense product's (kDense: g.dense) weights do not depend on
// that kernel, so its first column steps are loaded into registers before waiting for it; they
// take its own instantiation, since holding them costs registers that the grouped products need
// for warps in flight.
template <GemvOutput kOutput, int kWarpRows, bool kDense>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const GemvLaunch launch) {
  constexpr int kWeightRows = kGemvHalves<kOutput> * kWarpRows;
  constexpr int kDepth = kGemvDepth<kOutput, kWarpRows>;
  const GroupedGemm& g = launch.g;
  const MoePairs& p = launch.p;
  const int split = launch.split;
  constexpr bool dense = kDense;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % split;
  const int slices = kOutput == GemvOutput::kCombine ? split / launch.groups_per_set : split;
  const int group = kOutput == GemvOutput::kCombine ? part / slices : blockIdx.y;
  const int slice = part % slices;
  const int out_rows = kOutput == GemvOutput::kSwiglu ? g.out_rows / 2 : g.out_rows;
  const int row0 = (blockIdx.x * (kGemvWarps / split) + warp / split) * kWarpRows;
  const int vectors = g.in_cols / 8;
  const int stride = 32 * slices;  // vectors between a lane's consecutive loads of a row
  // Weight row k of the warp; rows past the end read the last row and are not written.
  const auto weight_row = [&](int k) {
    const int r = min(row0 + k % kWarpRows, out_rows - 1);
    return k < kWarpRows ? r : out_rows + r;
  };
  const uint4* rows[kWeightRows];
  const auto weights_from = [&](const uint16_t* w) {
#pragma unroll
    for (int k = 0; k < kWeightRows; ++k) {
      rows[k] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(weight_row(k)) * g.in_cols);
    }
  };
  const auto weight = [&](int v, int k) {
    return v < vectors ? __ldcs(rows[k] + v) : make_uint4(0, 0, 0, 0);
  };
  uint4 wv[kDepth][kWeightRows];
  const auto load_weights = [&](int base) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int k = 0; k < kWeightRows; ++k) wv[d][k] = weight(base + stride * d, k);
    }
  };
  const int first_base = slice * 32 + lane;
  if constexpr (dense) {
    weights_from(g.dense);
    load_weights(first_base);
  }
  follow_prior_grid();
  // The group's first pair and expert are loaded with the number of groups, not after it: the
  // weights' addresses were two round trips behind the wait. A group past the number of groups
  // reads entries of the pairs' arrays (grid.y is at most their length) and returns unused.
  const int num_groups = dense ? 0 : *p.num_groups;
  const int first = dense ? 0 : p.group_first[group];
  const int expert = dense ? 0 : p.group_expert[group];
  if (!dense && group >= num_groups) return;  // uniform: never for kCombine
  if (!dense) weights_from(g.weights[expert]);
  const int64_t input_row = dense ? 0 : g.input_is_token ? p.token[first] : first;
  const uint4* x = reinterpret_cast<const uint4*>(g.input + input_row * g.in_cols);
  float acc[kWeightRows] = {};
  for (int base = first_base; base < vectors; base += stride * kDepth) {
    uint4 xv[kDepth];
    if constexpr (dense) {
      if (base != first_base) load_weights(base);
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int v = base + stride * d;
      xv[d] = v < vectors ? __ldg(x + v) : make_uint4(0, 0, 0, 0);
      if constexpr (!dense) {
#pragma unroll
        for (int k = 0; k < kWeightRows; ++k) wv[d][k] = weight(v, k);
      }
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
#pragma unroll
      for (int k = 0; k < kWeightRows; ++k) acc[k] = dot8(wv[d][k], xv[d], acc[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kWeightRows; ++k) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], offset);
    }
  }
  __shared__ float partial[kGemvWarps][kWeightRows];
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kWeightRows; ++k) partial[warp][k] = acc[k];
  }
  __syncthreads();
  if (part != 0 || lane >= kWarpRows || row0 + lane >= out_rows) return;
  const int row = row0 + lane;
  // A group's sum over its slices, in slice order.
  const auto sum = [&](int first_warp, int k) {
    float value = 0.0f;
    for (int q = 0; q < slices; ++q) value += partial[first_warp + q][k];
    return value;
  };
  if constexpr (kOutput == GemvOutput::kOutputRows) {
    *output_address(g, first, 1, 0, row) = sum(warp, lane);
  } else if constexpr (kOutput == GemvOutput::kSwiglu) {
    const float gate = sum(warp, lane), up = sum(warp, kWarpRows + lane);
    g.swiglu_out[static_cast<int64_t>(first) * out_rows + row] = swiglu_bf16(gate, up);
  } else {
    float value = 0.0f;  // as combine_kernel adds them
    for (int j = 0; j < launch.groups_per_set; ++j) {
      const int pair = p.group_first[j];
      if (p.expert[pair] != launch.disabled_expert) {
        value += p.gate[pair] * sum(warp + j * slices, lane);
      }
    }
    g.out[row] = value;
  }
}

int multiprocessors();

// Launches gemv_kernel with one output row per warp where a row holds a column step of every
// lane's loads (else two), and as many warps per row set as keep about 48 warps per
// multiprocessor reading while each still reads a whole column step; kCombine's row sets hold one
// warp group per pair, `groups` of them. Grouped products split only while the grid stays one
// wave: a second wave's CTAs look their group up after the wait again, where a dense product's
// second wave has its weights' addresses at once.
template <GemvOutput kOutput>
void launch_gemv(const GroupedGemm& g, const MoePairs& pairs, int groups, int disabled_expert,
                 cudaStream_t stream) {
  const auto launch_rows = [&](auto rows) {
    constexpr int kWarpRows = decltype(rows)::value;
    constexpr int kDepth = kGemvDepth<kOutput, kWarpRows>;
    const bool combine = kOutput == GemvOutput::kCombine;
    const int out_rows = kOutput == GemvOutput::kSwiglu ? g.out_rows / 2 : g.out_rows;
    const int64_t warps = static_cast<int64_t>(groups) * ((out_rows + kWarpRows - 1) / kWarpRows);
    const int64_t wave = 48 * multiprocessors();
    int slices = 1;
    while ((combine ? groups : 1) * slices * 2 <= kGemvWarps &&
           (g.dense != nullptr ? warps * slices < wave : warps * slices * 2 <= wave) &&
           g.in_cols / 8 >= 32 * kDepth * slices * 2) {
      slices *= 2;
    }
    GemvLaunch launch{g, pairs, (combine ? groups : 1) * slices, combine ? groups : 1,
                      disabled_expert};
    const int rows_per_cta = kGemvWarps / launch.split * kWarpRows;
    const dim3 grid((out_rows + rows_per_cta - 1) / rows_per_cta, combine ? 1 : groups);
    if (g.dense != nullptr) {
      launch_overlapping(gemv_kernel<kOutput, kWarpRows, true>, grid, dim3(kGemvWarps * 32), 0,
                         stream, launch);
    } else {
      launch_overlapping(gemv_kernel<kOutput, kWarpRows, false>, grid, dim3(kGemvWarps * 32), 0,
                         stream, launch);
    }
  };
  if (g.in_cols / 8 >= 32 * kGemvDepth<kOutput, 1>) {
    launch_rows(std::integral_constant<int, 1>{});
  } else {
    launch_rows(std::integral_constant<int, 2>{});
  }
}

int multiprocessors() {
  static const int count = [] {
    int device = 0, value = 0;
    EKVA_CUDA_CHECK(cudaGetDevice(&device));
    EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMultiProcessorCount, device));
    return value;
  }();
  return count;
}

// grid: (column blocks, tokens): a CTA's threads read one token's pairs' rows side by side (no
// thread divides a flat index by the hidden size), the pairs' rows and gates fetched once per CTA
// so that every row's load is issued before any is added. Top-k of at most 32 (route_tokens').
constexpr int kMaxCombinedPairs = 32;
constexpr int kCombineThreads = 256;
__device__ __forceinline__ float row_value(const float* y, int64_t at) {
  return y[at];
}
__device__ __forceinline__ float row_value(const uint16_t* y, int64_t at) {
  return bf16_bits_to_float(y[at]);
}
// Columns at .. at + 3 of a row (at a multiple of 4, the row aligned to four elements).
__device__ __forceinline__ float4 row_vector(const float* y, int64_t at) {
  return *reinterpret_cast<const float4*>(y + at);
}
__device__ __forceinline__ float4 row_vector(const uint16_t* y, int64_t at) {
  const uint2 packed = *reinterpret_cast<const uint2*>(y + at);
  const float2 lo = unpack_bf16(packed.x), hi = unpack_bf16(packed.y);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
// kNorm (norm.weight; a CTA per token): out is the residual x, to which the token's sum is added,
// and the sum is then normalised as rms_norm normalises it into norm.out_bf16: the experts' sum,
// the residual add and the next norm in one pass, where a separate norm wrote and read back the
// sum.
template <typename Y, bool kNorm>
__global__ void combine_kernel(const Y* y, const MoePairs p, int n, int k, int hidden, int vectors,
                               int disabled_expert, float* out, const ResidualNorm norm) {
  follow_prior_grid();
  __shared__ double norm_partial[kCombineThreads / 32];
  __shared__ int64_t row[kMaxCombinedPairs];
  __shared__ float gate[kMaxCombinedPairs];
  __shared__ bool added[kMaxCombinedPairs];
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    [[maybe_unused]] double sum_squares = 0.0;
    __syncthreads();  // the previous token's rows (and norm_partial) are read
    if (threadIdx.x < k) {
      const int j = p.token_pairs[t * k + threadIdx.x];
      row[threadIdx.x] = static_cast<int64_t>(j) * hidden;
      gate[threadIdx.x] = p.gate[j];
      added[threadIdx.x] = p.expert[j] != disabled_expert;
    }
    __syncthreads();
    // Four columns per thread in the first `vectors` four-column vectors of each row (the rows are
    // read once, so the kernel is bound by how many bytes each load brings in), one after them.
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < vectors; c += gridDim.x * blockDim.x) {
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int r = 0; r < k; ++r) {
        if (!added[r]) continue;
        const float4 x = row_vector(y, row[r] + 4 * c);
        v.x += gate[r] * x.x;
        v.y += gate[r] * x.y;
        v.z += gate[r] * x.z;
        v.w += gate[r] * x.w;
      }
      float4* at = reinterpret_cast<float4*>(out + t * hidden) + c;
      if constexpr (kNorm) {
        const float4 x = *at;
        v = make_float4(x.x + v.x, x.y + v.y, x.z + v.z, x.w + v.w);
        sum_squares += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y +
                       static_cast<double>(v.z) * v.z + static_cast<double>(v.w) * v.w;
      }
      *at = v;
    }
    for (int c = 4 * vectors + blockIdx.x * blockDim.x + threadIdx.x; c < hidden;
         c += gridDim.x * blockDim.x) {
      float v = 0.0f;
      for (int r = 0; r < k; ++r) {
        if (added[r]) v += gate[r] * row_value(y, row[r] + c);
      }
      if constexpr (kNorm) {
        v = out[t * hidden + c] + v;
        sum_squares += static_cast<double>(v) * v;
      }
      out[t * hidden + c] = v;
    }
    if constexpr (kNorm) {
      for (int o = 16; o > 0; o /= 2) sum_squares += __shfl_xor_sync(0xffffffffu, sum_squares, o);
      if (threadIdx.x % 32 == 0) norm_partial[threadIdx.x / 32] = sum_squares;
      __syncthreads();
      double total = 0.0;
      for (int w = 0; w < kCombineThreads / 32; ++w) total += norm_partial[w];
      const float inv = inverse_rms(total, hidden, norm.eps);
      // Each thread reads back the columns it wrote.
      for (int c = threadIdx.x; c < vectors; c += kCombineThreads) {
        const float4 v = reinterpret_cast<const float4*>(out + t * hidden)[c];
        const float4 w = reinterpret_cast<const float4*>(norm.weight)[c];
        *reinterpret_cast<uint2*>(norm.out_bf16 + t * hidden + 4 * c) =
            make_uint2(pack_bf16(rms_normed(v.x, inv, w.x), rms_normed(v.y, inv, w.y)),
                       pack_bf16(rms_normed(v.z, inv, w.z), rms_normed(v.w, inv, w.w)));
      }
      for (int c = 4 * vectors + threadIdx.x; c < hidden; c += kCombineThreads) {
        norm.out_bf16[t * hidden + c] =
            to_bf16_bits(rms_normed(out[t * hidden + c], inv, norm.weight[c]));
      }
    }
  }
}

}  // namespace

bool grouped_gemm_supported(int in_cols, int num_experts) {
  return in_cols % 8 == 0 && num_experts <= kMaxGroupedExperts;
}

void sort_pairs(const int32_t* experts, const float* gates, int n, int k, int num_experts,
                const MoePairs& pairs, cudaStream_t stream) {
  if (n < 0 || num_experts > kMaxGroupedExperts || k < 1 || k > num_experts) {
    fail(ErrorKind::kUnsupported, "sort_pairs: {} tokens of top-{} over {} experts (at most {})", n,
         k, num_experts, kMaxGroupedExperts);
  }
  // A CTA per kSortCtaPairs pairs, up to kSortMaxCtas; their counts go to the tail of
  // group_expert, past the most groups the step can have (a sort of this size has at most
  // num_experts + pairs / 64 groups, and the tail takes at most pairs / 16 ints).
  const int total = n * k;
  const int ctas = std::clamp(total / kSortCtaPairs, 1, kSortMaxCtas);
  const int group_tokens = moe_group_tokens(n, k, num_experts);
  int32_t* cta_counts = pairs.group_expert + total - ctas * num_experts;
  if (ctas > 1) {
    launch_overlapping(sort_count_kernel, dim3(ctas), dim3(kSortThreads), 0, stream, experts, n, k,
                       num_experts, cta_counts);
  }
  launch_overlapping(sort_pairs_kernel, dim3(ctas), dim3(kSortThreads), 0, stream, experts, gates,
                     n, k, num_experts, group_tokens, static_cast<const int32_t*>(cta_counts),
                     pairs);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

namespace {

// Launches the grouped product over at most `groups` groups of at most max_rows input rows each,
// whose outputs span out_count rows of g.out.
void launch_grouped_gemm(const GroupedGemm& g, const MoePairs& pairs, int max_rows, int groups,
                         int out_count, cudaStream_t stream) {
  // The grid is cut along the columns until it is about four waves of two CTAs per
  // multiprocessor (fewer CTAs leave a long last wave), each part at least two column steps; the
  // parts then add into a zeroed output.
  // The kernel holds element offsets of the weights and the input rows in 32 bits.
  constexpr int64_t kMaxElements = int64_t{1} << 32;
  if (static_cast<int64_t>(g.out_rows) * g.in_cols >= kMaxElements ||
      static_cast<int64_t>(out_count) * g.in_cols >= kMaxElements) {
    fail(ErrorKind::kUnsupported,
         "grouped_gemm: {} x {} weights or {} input rows of {} columns (fewer than 2^32 elements "
         "each)",
         g.out_rows, g.in_cols, out_count, g.in_cols);
  }
  const bool swiglu = g.swiglu_out != nullptr;
  if (swiglu && (!(max_rows == 1 || max_rows > kMaxGroupedTokens) || g.out_rows % 2 != 0)) {
    fail(ErrorKind::kUnsupported,
         "grouped_gemm: a SwiGLU output needs one input row per group or wide groups ({} rows), "
         "and an even number of output rows ({})",
         max_rows, g.out_rows);
  }
  if (g.out_bf16 != nullptr && max_rows <= kMaxGroupedTokens) {
    fail(ErrorKind::kUnsupported, "grouped_gemm: bf16 output rows need wide groups ({} rows)",
         max_rows);
  }
  if (swiglu && max_rows == 1) {
    launch_gemv<GemvOutput::kSwiglu>(g, pairs, groups, -1, stream);
    return;
  }
  if (max_rows == 1) {
    launch_gemv<GemvOutput::kOutputRows>(g, pairs, groups, -1, stream);
    return;
  }
  // A SwiGLU tile takes half as many outputs (their gate and up rows); neither it nor a bf16
  // output is ever split.
  const bool wide = max_rows > kMaxGroupedTokens;
  const int tile_rows = wide ? kWideRows : GroupedGemmShape<kMaxGroupedTokens>::kRows;
  const int row_tiles = swiglu ? (g.out_rows / 2 + tile_rows / 2 - 1) / (tile_rows / 2)
                               : (g.out_rows + tile_rows - 1) / tile_rows;
  const int steps = (g.in_cols + kCols - 1) / kCols;
  const int wanted = (8 * multiprocessors() + row_tiles * groups - 1) / (row_tiles * groups);
  const int splits = swiglu || g.out_bf16 != nullptr ? 1 : std::max(1, std::min(wanted, steps / 2));
  const int split_cols = ((steps + splits - 1) / splits) * kCols;
  if (splits > 1) {
    EKVA_CUDA_CHECK(cudaMemsetAsync(
        g.out, 0, static_cast<size_t>(out_count) * g.out_rows * sizeof(float), stream));
  }
  const int column_splits = (g.in_cols + split_cols - 1) / split_cols;
  // Several CTAs share a multiprocessor only with its largest shared-memory carveout.
  const auto opt_in = [](auto kernel, int bytes) {
    EKVA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    EKVA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         cudaSharedmemCarveoutMaxShared));
    return true;
  };
  if (wide) {
    static const bool opted_in = opt_in(grouped_gemm_wide_kernel, kWideSharedBytes);
    (void)opted_in;
    // One CTA per multiprocessor, or per tile where the step has fewer (the groups are known on
    // the device alone: `groups` is their most).
    const int64_t tiles = static_cast<int64_t>(groups) * row_tiles * column_splits;
    const int ctas = static_cast<int>(std::min<int64_t>(multiprocessors(), tiles));
    launch_overlapping(grouped_gemm_wide_kernel, dim3(ctas), dim3(kWideThreads), kWideSharedBytes,
                       stream, g, pairs, row_tiles, column_splits, split_cols, !g.input_is_token);
    EKVA_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const auto launch = [&](auto tokens) {
    constexpr int kTokens = decltype(tokens)::value;
    constexpr int bytes = GroupedGemmShape<kTokens>::kSharedBytes;
    static const bool opted_in = opt_in(grouped_gemm_kernel<kTokens>, bytes);
    (void)opted_in;
    launch_overlapping(grouped_gemm_kernel<kTokens>, dim3(row_tiles, groups, column_splits),
                       dim3(GroupedGemmShape<kTokens>::kWarps * 32), bytes, stream, g, pairs,
                       split_cols);
  };
  if (max_rows <= 16) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, kMaxGroupedTokens>{});
  }
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void grouped_gemm(const GroupedGemm& g, const MoePairs& pairs, int n, int k, int num_experts,
                  cudaStream_t stream) {
  // A token routes to an expert at most once: at most min(experts, pairs) experts are touched,
  // and an expert's c pairs take ceil(c / group) groups, so there are at most pairs / group more
  // groups than touched experts (none when n fits in one group).
  const int group = moe_group_tokens(n, k, num_experts);
  const int64_t pairs_total = static_cast<int64_t>(n) * k;
  const int64_t groups =
      std::min<int64_t>(num_experts, pairs_total) + (n > group ? pairs_total / group : 0);
  if (!grouped_gemm_supported(g.in_cols, num_experts) || groups > 65535) {
    fail(ErrorKind::kUnsupported,
         "grouped_gemm: {} input columns (a multiple of 8) of {} experts (at most {}), {} pairs "
         "(at most {} groups of {})",
         g.in_cols, num_experts, kMaxGroupedExperts, pairs_total, 65535, group);
  }
  if (groups == 0) return;
  launch_grouped_gemm(g, pairs, std::min(n, group), static_cast<int>(groups),
                      static_cast<int>(pairs_total), stream);
}

bool combined_gemv_supported(int n, int top_k) {
  return n == 1 && top_k >= 1 && top_k <= kGemvWarps && (top_k & (top_k - 1)) == 0;
}

void grouped_gemm_combined(const GroupedGemm& g, const MoePairs& pairs, int top_k,
                           int disabled_expert, float* out, cudaStream_t stream) {
  if (!combined_gemv_supported(1, top_k) || !grouped_gemm_supported(g.in_cols, top_k) ||
      g.dense != nullptr || g.swiglu_out != nullptr) {
    fail(ErrorKind::kUnsupported,
         "grouped_gemm_combined: top-{} (1, 2, 4 or 8) of experts, {} input columns (a multiple "
         "of 8)",
         top_k, g.in_cols);
  }
  GroupedGemm into = g;
  into.out = out;
  launch_gemv<GemvOutput::kCombine>(into, pairs, top_k, disabled_expert, stream);
}

bool skinny_gemm_supported(int n, int in_cols) {
  return n <= kMaxGroupedTokens && in_cols % 8 == 0;
}

namespace {

// first_rows 0: one block.
void launch_skinny_gemm(const uint16_t* x, int n, const uint16_t* w, int first_rows, int block_rows,
                        int out_rows, int in_cols, float* y, cudaStream_t stream) {
  if (!skinny_gemm_supported(n, in_cols) ||
      (first_rows > 0 && (block_rows <= 0 || (out_rows - first_rows) % block_rows != 0))) {
    fail(ErrorKind::kUnsupported,
         "skinny_gemm: {} rows (at most {}) of {} columns (a multiple of 8), {} output rows as {} "
         "and blocks of {}",
         n, kMaxGroupedTokens, in_cols, out_rows, first_rows, block_rows);
  }
  if (n == 0) return;
  GroupedGemm g;
  g.dense = w;
  g.dense_rows = n;
  g.input = x;
  g.out = y;
  g.out_rows = out_rows;
  g.in_cols = in_cols;
  g.first_block_rows = first_rows;
  g.block_rows = block_rows;
  launch_grouped_gemm(g, MoePairs{}, n, 1, n, stream);
}

}  // namespace

void skinny_gemm(const uint16_t* x, int n, const uint16_t* w, int out_rows, int in_cols, float* y,
                 cudaStream_t stream) {
  launch_skinny_gemm(x, n, w, 0, 0, out_rows, in_cols, y, stream);
}

void skinny_gemm_blocks(const uint16_t* x, int n, const uint16_t* w, int first_rows, int block_rows,
                        int out_rows, int in_cols, float* y, cudaStream_t stream) {
  if (first_rows <= 0) {
    fail(ErrorKind::kUnsupported, "skinny_gemm_blocks: a first block of {} rows", first_rows);
  }
  launch_skinny_gemm(x, n, w, first_rows, block_rows, out_rows, in_cols, y, stream);
}

namespace {

template <typename Y>
void launch_combine(const Y* y, const MoePairs& pairs, int n, int k, int hidden,
                    int disabled_expert, float* out, const ResidualNorm& norm,
                    cudaStream_t stream) {
  if (k < 1 || k > kMaxCombinedPairs) {
    fail(ErrorKind::kUnsupported, "combine_pairs: top-{} (at most {})", k, kMaxCombinedPairs);
  }
  const bool normed = norm.weight != nullptr;
  if (normed && norm.out_bf16 == nullptr) {
    fail(ErrorKind::kUnsupported, "combine_pairs: a norm needs a bf16 output row");
  }
  if (n == 0 || hidden == 0) return;
  const bool aligned = hidden % 4 == 0 && reinterpret_cast<uintptr_t>(y) % (4 * sizeof(Y)) == 0 &&
                       reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                       (!normed || (reinterpret_cast<uintptr_t>(norm.weight) % 16 == 0 &&
                                    reinterpret_cast<uintptr_t>(norm.out_bf16) % 8 == 0));
  const int vectors = aligned ? hidden / 4 : 0;
  const int per_thread = aligned ? vectors : hidden;  // a thread takes a vector or a column
  // A token's row takes one CTA when it is normalised.
  const dim3 grid(normed ? 1 : (per_thread + kCombineThreads - 1) / kCombineThreads,
                  std::min(n, 65535));
  if constexpr (std::is_same_v<Y, uint16_t>) {  // only bf16 rows are normalised (combine_pairs)
    if (normed) {
      launch_overlapping(combine_kernel<Y, true>, grid, dim3(kCombineThreads), 0, stream, y, pairs,
                         n, k, hidden, vectors, disabled_expert, out, norm);
      EKVA_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  launch_overlapping(combine_kernel<Y, false>, grid, dim3(kCombineThreads), 0, stream, y, pairs, n,
                     k, hidden, vectors, disabled_expert, out, norm);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void combine_pairs(const float* y, const MoePairs& pairs, int n, int k, int hidden,
                   int disabled_expert, float* out, cudaStream_t stream) {
  launch_combine(y, pairs, n, k, hidden, disabled_expert, out, ResidualNorm{}, stream);
}

void combine_pairs(const uint16_t* y, const MoePairs& pairs, int n, int k, int hidden,
                   int disabled_expert, float* out, const ResidualNorm& norm, cudaStream_t stream) {
  launch_combine(y, pairs, n, k, hidden, disabled_expert, out, norm, stream);
}

}  // namespace ekva::cuda
