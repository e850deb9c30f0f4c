// The kernels of cuda_product_chain_bench (product_chain.h).
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "product_chain.h"

namespace ekva::cuda {
namespace {

constexpr int kChunk = kChainChunk;
constexpr int kLoads = kChunk / 8 / 32;  // 16-byte loads a lane per step
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
using Product = ChainProduct;

struct StepWeights {
  uint4 v[kLoads];
};

__device__ __forceinline__ int step_vectors(const Product& p, int chunk) {
  return min(kChunk, p.in_cols - chunk * kChunk) / 8;
}

__device__ __forceinline__ void load_step(const Product& p, int row, int chunk, int lane,
                                          StepWeights& w) {
  const int vectors = step_vectors(p, chunk);
  const auto* src =
      reinterpret_cast<const uint4*>(p.w + static_cast<int64_t>(row) * p.in_cols + chunk * kChunk);
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int v = lane + 32 * k;
    w.v[k] = v < vectors ? __ldcs(src + v) : make_uint4(0, 0, 0, 0);
  }
}

// The lane's part of a step's dot product, added to acc; x: the input row's 16-byte vectors.
__device__ __forceinline__ float step_sum(const Product& p, int chunk, int lane,
                                          const StepWeights& w, const uint4* x, float acc) {
  const int vectors = step_vectors(p, chunk);
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int v = lane + 32 * k;
    if (v < vectors) acc = dot8(w.v[k], x[chunk * (kChunk / 8) + v], acc);
  }
  return acc;
}

// The row's sum over the warp, stored as bf16 by lane 0.
__device__ __forceinline__ void store_row(const Product& p, int row, int lane, float acc) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  if (lane == 0) p.y[row] = to_bf16_bits(acc);
}

// One product, a warp per row; its first step's weights are loaded before the wait for the
// kernel before, which writes its input row, unless they wait for a product's outputs (p.after).
__global__ void __launch_bounds__(kThreads, 3) product_kernel(const Product p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  StepWeights w0, w1;
  if (row < p.rows && p.after < 0) load_step(p, row, 0, lane, w0);
  wait_for_prior_grid();
  allow_next_grid();
  if (row >= p.rows) return;
  if (p.after >= 0) load_step(p, row, 0, lane, w0);
  const auto* x = reinterpret_cast<const uint4*>(p.x);
  float acc = 0.0f;
  for (int chunk = 0; chunk < p.chunks; chunk += 2) {
    if (chunk + 1 < p.chunks) load_step(p, row, chunk + 1, lane, w1);
    acc = step_sum(p, chunk, lane, w0, x, acc);
    if (chunk + 1 >= p.chunks) break;
    if (chunk + 2 < p.chunks) load_step(p, row, chunk + 2, lane, w0);
    acc = step_sum(p, chunk + 1, lane, w1, x, acc);
  }
  store_row(p, row, lane, acc);
}

__device__ __forceinline__ int load_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acquire() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
__device__ __forceinline__ void add_release(int* p, int value) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(value) : "memory");
}

// Warp w's rows of product p: first, first + W, ... (W warps in the grid).
__device__ __forceinline__ int first_row(const Product& p, int w, int total_warps) {
  return (w - p.first_warp + total_warps) % total_warps;
}

// A warp's place in its steps of the chain: rows first_row, first_row + W, ... of each product
// (W warps in the grid), each row's chunks in order.
struct StepCursor {
  int p = 0, row = 0, chunk = 0;
};

struct WarpSteps {
  const Product* products;
  int num_products, warp, total_warps;

  __device__ StepCursor first() const {
    StepCursor c{0, first_row(products[0], warp, total_warps), 0};
    settle(c);
    return c;
  }
  // Past the products in which the warp has no row left.
  __device__ void settle(StepCursor& c) const {
    while (c.p < num_products && c.row >= products[c.p].rows) {
      if (++c.p < num_products) c.row = first_row(products[c.p], warp, total_warps);
    }
  }
  __device__ void advance(StepCursor& c) const {
    if (++c.chunk == products[c.p].chunks) {
      c.chunk = 0;
      c.row += total_warps;
      settle(c);
    }
  }
};

// Counts the CTA's rows of product p_index - 1 once its Threads multiplying threads are done with
// them, then waits until every CTA's are counted (all CTAs of the grid are resident). counts: one
// per product. The count is polled with relaxed loads and one acquire fence follows the last poll
// (an acquire load in the loop costs each round a fence).
template <int Threads>
__device__ __forceinline__ void wait_for_product(const Product* products, int p_index, int* counts,
                                                 int total_warps) {
  constexpr int kCtaWarps = Threads / 32;
  named_barrier_sync<Threads>(1);
  const Product& before = products[p_index - 1];
  if (threadIdx.x == 0) {
    int mine = 0;
    for (int k = 0; k < kCtaWarps; ++k) {
      const int f = first_row(before, blockIdx.x * kCtaWarps + k, total_warps);
      if (f < before.rows) mine += (before.rows - 1 - f) / total_warps + 1;
    }
    int* count = counts + p_index - 1;
    if (mine > 0) add_release(count, mine);
    while (load_relaxed(count) != before.rows) {
    }
    fence_acquire();
  }
  named_barrier_sync<Threads>(1);
}

// The CTA's copy of product p's input row in shared memory, made by its Threads multiplying
// threads.
template <int Threads>
__device__ __forceinline__ void copy_input_row(const Product& p, uint4* x_row) {
  const auto* x = reinterpret_cast<const uint4*>(p.x);
  for (int v = threadIdx.x; v < p.in_cols / 8; v += Threads) x_row[v] = __ldcg(x + v);
  named_barrier_sync<Threads>(1);
}

// The whole chain. Each CTA copies a product's input row into shared memory once the counts say
// the product before is complete; each warp holds the weights of its next step (of a later
// product, across the wait) while it multiplies the current one. counts: [products],
// zero before the launch.
__global__ void __launch_bounds__(kThreads, 2)
    chain_kernel(const Product* products, int num_products, int* counts) {
  extern __shared__ __align__(16) uint4 x_row[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WarpSteps steps{products, num_products, static_cast<int>(blockIdx.x) * kWarps + warp,
                        static_cast<int>(gridDim.x) * kWarps};
  // The warp's next step, one ahead of the multiply.
  StepCursor next = steps.first();
  // Two register buffers, each named statically in its branch (an array indexed by a variable
  // would go to local memory).
  StepWeights buffer0, buffer1;
  bool next_in_0 = true;
  // The next step's load waits for a product not yet complete (its after); it is made at the
  // first product start past that one.
  bool deferred = next.p < num_products;
  for (int p_index = 0; p_index < num_products; ++p_index) {
    const Product p = products[p_index];
    if (p_index > 0) wait_for_product<kThreads>(products, p_index, counts, steps.total_warps);
    if (deferred && products[next.p].after < p_index) {
      if (next_in_0) {
        load_step(products[next.p], next.row, next.chunk, lane, buffer0);
      } else {
        load_step(products[next.p], next.row, next.chunk, lane, buffer1);
      }
      deferred = false;
    }
    copy_input_row<kThreads>(p, x_row);
    float acc = 0.0f;
    const auto step = [&](const StepWeights& current, StepWeights& following) {
      const StepCursor now = next;
      steps.advance(next);
      if (next.p < num_products) {
        deferred = products[next.p].after >= p_index;
        if (!deferred) load_step(products[next.p], next.row, next.chunk, lane, following);
      }
      acc = step_sum(p, now.chunk, lane, current, x_row, acc);
      if (now.chunk + 1 == p.chunks) {
        store_row(p, now.row, lane, acc);
        acc = 0.0f;
      }
    };
    while (next.p == p_index) {
      if (next_in_0) {
        step(buffer0, buffer1);
      } else {
        step(buffer1, buffer0);
      }
      next_in_0 = !next_in_0;
    }
  }
}

// The whole chain with each warp's next steps staged in shared memory by a copying warp: its lane
// w copies multiplying warp w's steps in order (one cp.async.bulk of up to 4 KB a step) into the
// warp's ring of kStagedSteps slots as soon as the warp has read a slot, so that the copies run
// ahead across a product's wait as far as the rings allow (about 21 MB GPU-wide), where the
// register form's stop at one step a warp. One CTA a multiprocessor; shared memory holds the
// rings, their full and empty barriers and the input row.
constexpr int kStagedWarps = 8;  // multiplying warps, and one copying warp
constexpr int kStagedThreads = kStagedWarps * 32;
constexpr int kStagedSteps = 5;
constexpr int kStagedSlots = kStagedSteps * kStagedWarps;
constexpr size_t kStageBytes = size_t{kChunk} * sizeof(uint16_t);  // a warp's step
constexpr size_t kStagedFixedBytes =
    kStageBytes * kStagedSlots + 2 * kStagedSlots * sizeof(uint64_t);

// A position in a warp's ring: the copying lane and the multiplying warp walk it in the same order,
// the barriers' parity flipping at each lap.
struct RingPosition {
  int slot = 0;
  uint32_t parity = 0;
  __device__ void advance() {
    if (++slot == kStagedSteps) {
      slot = 0;
      parity ^= 1;
    }
  }
};

__global__ void __launch_bounds__(kStagedThreads + 32, 1)
    staged_chain_kernel(const Product* products, int num_products, int* counts) {
  extern __shared__ __align__(16) uint4 staged_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int total_warps = static_cast<int>(gridDim.x) * kStagedWarps;
  uint4* const ring = staged_smem;
  auto* const full = reinterpret_cast<uint64_t*>(staged_smem + kStageBytes * kStagedSlots / 16);
  uint64_t* const empty = full + kStagedSlots;
  auto* const x_row = reinterpret_cast<uint4*>(empty + kStagedSlots);
  const auto slot_data = [&](int w, int slot) {
    return ring + (w * kStagedSteps + slot) * (kStageBytes / 16);
  };
  if (threadIdx.x < kStagedSlots) {
    mbarrier_init(shared_address(full + threadIdx.x), 1);
    mbarrier_init(shared_address(empty + threadIdx.x), 1);
  }
  __syncthreads();
  if (warp == kStagedWarps) {
    if (lane >= kStagedWarps) return;
    const WarpSteps steps{products, num_products,
                          static_cast<int>(blockIdx.x) * kStagedWarps + lane, total_warps};
    RingPosition at;
    int complete = 0;  // products before this one are known complete
    // Never blocks on one slot or count: the lanes poll their own warps' slots side by side.
    for (StepCursor c = steps.first(); c.p < num_products;) {
      const Product& p = products[c.p];
      if (p.after >= complete) {
        if (load_relaxed(counts + p.after) != products[p.after].rows) continue;
        fence_acquire();
        complete = p.after + 1;
      }
      const int b = lane * kStagedSteps + at.slot;
      if (!mbarrier_ready(shared_address(empty + b), at.parity ^ 1)) continue;
      const uint32_t bytes = step_vectors(p, c.chunk) * 16;
      mbarrier_expect_bytes(shared_address(full + b), bytes);
      bulk_copy_to_shared(shared_address(slot_data(lane, at.slot)),
                          p.w + static_cast<int64_t>(c.row) * p.in_cols + c.chunk * kChunk, bytes,
                          shared_address(full + b));
      steps.advance(c);
      at.advance();
    }
    return;
  }
  const WarpSteps steps{products, num_products, static_cast<int>(blockIdx.x) * kStagedWarps + warp,
                        total_warps};
  StepCursor c = steps.first();
  RingPosition at;
  for (int p_index = 0; p_index < num_products; ++p_index) {
    const Product p = products[p_index];
    if (p_index > 0) wait_for_product<kStagedThreads>(products, p_index, counts, total_warps);
    copy_input_row<kStagedThreads>(p, x_row);
    float acc = 0.0f;
    while (c.p == p_index) {
      const int b = warp * kStagedSteps + at.slot;
      mbarrier_wait(shared_address(full + b), at.parity);
      const uint4* stage = slot_data(warp, at.slot);
      const int vectors = step_vectors(p, c.chunk);
      StepWeights current;
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int v = lane + 32 * k;
        current.v[k] = v < vectors ? stage[v] : make_uint4(0, 0, 0, 0);
      }
      __syncwarp();
      if (lane == 0) mbarrier_arrive(shared_address(empty + b));
      acc = step_sum(p, c.chunk, lane, current, x_row, acc);
      if (c.chunk + 1 == p.chunks) {
        store_row(p, c.row, lane, acc);
        acc = 0.0f;
      }
      steps.advance(c);
      at.advance();
    }
  }
}

__global__ void fill_kernel(uint16_t* w, int64_t count, uint32_t seed, float a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
    w[i] = to_bf16_bits(u * a);
  }
}

}  // namespace

void fill_chain_weights(uint16_t* w, int64_t count, uint32_t seed, float a, cudaStream_t stream) {
  fill_kernel<<<1024, 256, 0, stream>>>(w, count, seed, a);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_chain_product(const ChainProduct& p, cudaStream_t stream) {
  launch_overlapping(product_kernel, dim3((p.rows + kWarps - 1) / kWarps), dim3(kThreads), 0,
                     stream, p);
}

int chain_grid(int max_in_cols) {
  const size_t x_bytes = static_cast<size_t>(max_in_cols) * sizeof(uint16_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(x_bytes)));
  int device = 0, sms = 0, per_sm = 0;
  EKVA_CUDA_CHECK(cudaGetDevice(&device));
  EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EKVA_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel, kThreads, x_bytes));
  // Every CTA must be resident at once: they wait on each other's counts.
  return sms * (per_sm < 2 ? per_sm : 2);
}

int chain_warps(int grid) {
  return grid * kWarps;
}

int staged_chain_grid(int max_in_cols) {
  const size_t bytes = kStagedFixedBytes + static_cast<size_t>(max_in_cols) * sizeof(uint16_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(
      staged_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int device = 0, sms = 0, per_sm = 0;
  EKVA_CUDA_CHECK(cudaGetDevice(&device));
  EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EKVA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, staged_chain_kernel,
                                                                kStagedThreads + 32, bytes));
  return per_sm < 1 ? 0 : sms;
}

int staged_chain_warps(int grid) {
  return grid * kStagedWarps;
}

void launch_staged_chain(const ChainProduct* products, int num_products, int max_in_cols, int grid,
                         int* counts, cudaStream_t stream) {
  if (grid < 1) EKVA_CUDA_CHECK(cudaErrorInvalidConfiguration);
  const size_t bytes = kStagedFixedBytes + static_cast<size_t>(max_in_cols) * sizeof(uint16_t);
  staged_chain_kernel<<<grid, kStagedThreads + 32, bytes, stream>>>(products, num_products, counts);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void launch_chain(const ChainProduct* products, int num_products, int max_in_cols, int grid,
                  int* counts, cudaStream_t stream) {
  if (grid < 1) EKVA_CUDA_CHECK(cudaErrorInvalidConfiguration);
  chain_kernel<<<grid, kThreads, static_cast<size_t>(max_in_cols) * sizeof(uint16_t), stream>>>(
      products, num_products, counts);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
