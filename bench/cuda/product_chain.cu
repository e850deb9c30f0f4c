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
constexpr int kCountSlots = kChainCountSlots;
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
// kernel before, which writes its input row.
__global__ void __launch_bounds__(kThreads, 3) product_kernel(const Product p) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarps + threadIdx.x / 32;
  StepWeights w0, w1;
  if (row < p.rows) load_step(p, row, 0, lane, w0);
  wait_for_prior_grid();
  allow_next_grid();
  if (row >= p.rows) return;
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

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
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

// Counts the CTA's rows of product p_index - 1 once all its warps are done with them, then waits
// until every CTA's are counted (all CTAs of the grid are resident).
__device__ __forceinline__ void wait_for_product(const Product* products, int p_index, int* counts,
                                                 int total_warps, int cta_warps) {
  __syncthreads();
  const Product& before = products[p_index - 1];
  if (threadIdx.x == 0) {
    int mine = 0;
    for (int k = 0; k < cta_warps; ++k) {
      const int f = first_row(before, blockIdx.x * cta_warps + k, total_warps);
      if (f < before.rows) mine += (before.rows - 1 - f) / total_warps + 1;
    }
    int* count = counts + (p_index - 1) * kCountSlots;
    if (mine > 0) add_release(count + blockIdx.x % kCountSlots, mine);
    for (;;) {
      int done = 0;
      for (int s = 0; s < kCountSlots; ++s) done += load_acquire(count + s);
      if (done == before.rows) break;
    }
  }
  __syncthreads();
}

// The CTA's copy of product p's input row in shared memory.
__device__ __forceinline__ void copy_input_row(const Product& p, uint4* x_row, int threads) {
  const auto* x = reinterpret_cast<const uint4*>(p.x);
  for (int v = threadIdx.x; v < p.in_cols / 8; v += threads) x_row[v] = __ldcg(x + v);
  __syncthreads();
}

// The whole chain. Each CTA copies a product's input row into shared memory once the counts say
// the product before is complete; each warp holds the weights of its next step (of a later
// product, across the wait) while it multiplies the current one. counts: [products, kCountSlots],
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
  if (next.p < num_products) load_step(products[next.p], next.row, next.chunk, lane, buffer0);
  for (int p_index = 0; p_index < num_products; ++p_index) {
    const Product p = products[p_index];
    if (p_index > 0) wait_for_product(products, p_index, counts, steps.total_warps, kWarps);
    copy_input_row(p, x_row, kThreads);
    float acc = 0.0f;
    const auto step = [&](const StepWeights& current, StepWeights& following) {
      const StepCursor now = next;
      steps.advance(next);
      if (next.p < num_products) {
        load_step(products[next.p], next.row, next.chunk, lane, following);
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

// The whole chain with each warp's weights staged in shared memory: each lane copies its own
// 16-byte vectors of the next kStagedSteps - 1 steps (cp.async, 4 KB a warp a step), so that 16 KB
// a warp stay on their way across a product's wait where the register form holds 4 KB. One
// CTA a multiprocessor; the input row sits after the warps' stages.
constexpr int kStagedWarps = 8;
constexpr int kStagedThreads = kStagedWarps * 32;
constexpr int kStagedSteps = 5;
constexpr size_t kStageBytes = size_t{kChunk} * sizeof(uint16_t);  // a warp's step
constexpr size_t kStagedRingBytes = kStageBytes * kStagedSteps * kStagedWarps;

__global__ void __launch_bounds__(kStagedThreads, 1)
    staged_chain_kernel(const Product* products, int num_products, int* counts) {
  extern __shared__ __align__(16) uint4 staged_smem[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WarpSteps steps{products, num_products, static_cast<int>(blockIdx.x) * kStagedWarps + warp,
                        static_cast<int>(gridDim.x) * kStagedWarps};
  uint4* const ring = staged_smem + warp * kStagedSteps * (kStageBytes / 16);
  uint4* const x_row = staged_smem + kStagedRingBytes / 16;
  // Copies the lane's vectors of step c into stage `slot` (nothing past the chain's end), and
  // closes the copy group either way so that the groups count steps.
  const auto issue = [&](const StepCursor& c, int slot) {
    if (c.p < num_products) {
      const Product& p = products[c.p];
      const int vectors = step_vectors(p, c.chunk);
      const auto* src = reinterpret_cast<const uint4*>(
          p.w + static_cast<int64_t>(c.row) * p.in_cols + c.chunk * kChunk);
      const uint32_t dst = shared_address(ring + slot * (kStageBytes / 16));
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int v = lane + 32 * k;
        if (v < vectors) cp_async_16(dst + v * 16, src + v, true);
      }
    }
    cp_async_commit();
  };
  StepCursor compute = steps.first();
  StepCursor ahead = compute;
  for (int s = 0; s < kStagedSteps - 1; ++s) {
    issue(ahead, s);
    if (ahead.p < num_products) steps.advance(ahead);
  }
  int slot = 0;
  for (int p_index = 0; p_index < num_products; ++p_index) {
    const Product p = products[p_index];
    if (p_index > 0) {
      wait_for_product(products, p_index, counts, steps.total_warps, kStagedWarps);
    }
    copy_input_row(p, x_row, kStagedThreads);
    float acc = 0.0f;
    while (compute.p == p_index) {
      cp_async_wait<kStagedSteps - 2>();  // this step's copies (the lane's own) have landed
      const uint4* stage = ring + slot * (kStageBytes / 16);
      StepWeights current;
#pragma unroll
      for (int k = 0; k < kLoads; ++k) current.v[k] = stage[lane + 32 * k];
      // The lane has read its vectors of the slot: the step kStagedSteps - 1 ahead refills it.
      issue(ahead, (slot + kStagedSteps - 1) % kStagedSteps);
      if (ahead.p < num_products) steps.advance(ahead);
      acc = step_sum(p, compute.chunk, lane, current, x_row, acc);
      if (compute.chunk + 1 == p.chunks) {
        store_row(p, compute.row, lane, acc);
        acc = 0.0f;
      }
      steps.advance(compute);
      slot = (slot + 1) % kStagedSteps;
    }
  }
  cp_async_wait<0>();
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
  const size_t bytes = kStagedRingBytes + static_cast<size_t>(max_in_cols) * sizeof(uint16_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(
      staged_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  int device = 0, sms = 0, per_sm = 0;
  EKVA_CUDA_CHECK(cudaGetDevice(&device));
  EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EKVA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, staged_chain_kernel,
                                                                kStagedThreads, bytes));
  return per_sm < 1 ? 0 : sms;
}

int staged_chain_warps(int grid) {
  return grid * kStagedWarps;
}

void launch_staged_chain(const ChainProduct* products, int num_products, int max_in_cols, int grid,
                         int* counts, cudaStream_t stream) {
  if (grid < 1) EKVA_CUDA_CHECK(cudaErrorInvalidConfiguration);
  const size_t bytes = kStagedRingBytes + static_cast<size_t>(max_in_cols) * sizeof(uint16_t);
  staged_chain_kernel<<<grid, kStagedThreads, bytes, stream>>>(products, num_products, counts);
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
