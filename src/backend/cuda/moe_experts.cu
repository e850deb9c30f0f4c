// Routed experts of a small step (decode) without the host: the step's (token, expert) pairs sorted
// by expert on the device, each touched expert's weights read once for all of its tokens by a
// grouped GEMV, and the gated sum per token in ascending expert order (as the CPU adds them).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

// One thread: a step has at most kMaxGroupedTokens x top_k pairs, a few hundred.
__global__ void sort_pairs_kernel(const int32_t* experts, const float* gates, int n, int k,
                                  int num_experts, MoePairs p) {
  extern __shared__ int32_t cursor[];  // [num_experts]
  if (threadIdx.x != 0) return;
  const int pairs = n * k;
  for (int e = 0; e < num_experts; ++e) cursor[e] = 0;
  for (int j = 0; j < pairs; ++j) ++cursor[experts[j]];
  int first = 0;
  int touched = 0;
  for (int e = 0; e < num_experts; ++e) {
    const int count = cursor[e];
    cursor[e] = first;
    if (count > 0) {
      p.touched[touched] = e;
      p.touched_first[touched] = first;
      ++touched;
    }
    first += count;
  }
  p.touched_first[touched] = pairs;
  *p.num_touched = touched;
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < k; ++i) {
      const int e = experts[t * k + i];
      const int j = cursor[e]++;
      p.token[j] = t;
      p.gate[j] = gates[t * k + i];
      p.expert[j] = e;
      // The token's pairs in ascending expert order: insertion into its k entries.
      int r = i;
      while (r > 0 && p.expert[p.token_pairs[t * k + r - 1]] > e) {
        p.token_pairs[t * k + r] = p.token_pairs[t * k + r - 1];
        --r;
      }
      p.token_pairs[t * k + r] = j;
    }
  }
}

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kTokens = 16;       // pairs of one expert per block
constexpr int kChunkCols = 2048;  // input columns staged in shared memory at a time
constexpr int kLoadsInFlight = 4;

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 pair = unpack_bf16(w[i]);
    f[2 * i] = pair.x;
    f[2 * i + 1] = pair.y;
  }
}

// grid: (row tiles, touched experts at most, token chunks at most). Each warp owns kRowsPerWarp
// output rows; its lanes stream 8 weights at a time and multiply them with every staged input.
__global__ void __launch_bounds__(kWarps * 32)
    grouped_gemv_kernel(const GroupedGemv g, const MoePairs p) {
  if (static_cast<int>(blockIdx.y) >= *p.num_touched) return;
  const int expert = p.touched[blockIdx.y];
  const int first = p.touched_first[blockIdx.y] + blockIdx.z * kTokens;
  const int count = min(kTokens, p.touched_first[blockIdx.y + 1] - first);
  if (count <= 0) return;
  extern __shared__ uint4 staged[];  // [kTokens][kChunkCols / 8]
  const uint16_t* w = g.weights[expert];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int row0 = blockIdx.x * kRowsPerBlock + warp * kRowsPerWarp;
  float acc[kRowsPerWarp][kTokens] = {};
  for (int c0 = 0; c0 < g.in_cols; c0 += kChunkCols) {
    const int vectors = min(kChunkCols, g.in_cols - c0) / 8;
    __syncthreads();
    for (int i = threadIdx.x; i < count * vectors; i += blockDim.x) {
      const int tok = i / vectors;
      const int pair = first + tok;
      const int64_t row = g.input_is_token ? p.token[pair] : pair;
      staged[tok * (kChunkCols / 8) + i % vectors] =
          reinterpret_cast<const uint4*>(g.input + row * g.in_cols + c0)[i % vectors];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = row0 + r;
      if (row >= g.out_rows) break;
      const uint4* wrow =
          reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * g.in_cols + c0);
      // kLoadsInFlight weight vectors per lane are requested before any is used: a GEMV is
      // bound by how many bytes are in flight.
      for (int v0 = lane; v0 < vectors; v0 += 32 * kLoadsInFlight) {
        uint4 loaded[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int v = v0 + 32 * u;
          loaded[u] = v < vectors ? __ldg(wrow + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int v = v0 + 32 * u;
          if (v >= vectors) break;
          float wf[8];
          unpack8(loaded[u], wf);
#pragma unroll
          for (int tok = 0; tok < kTokens; ++tok) {
            if (tok >= count) break;
            float xf[8];
            unpack8(staged[tok * (kChunkCols / 8) + v], xf);
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; ++q) s += wf[q] * xf[q];
            acc[r][tok] += s;
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row0 + r;
#pragma unroll
    for (int tok = 0; tok < kTokens; ++tok) {
      float s = acc[r][tok];
      for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
      if (lane == 0 && row < g.out_rows && tok < count)
        g.out[static_cast<int64_t>(first + tok) * g.out_rows + row] = s;
    }
  }
}

__global__ void combine_kernel(const float* y, const MoePairs p, int n, int k, int hidden,
                               int disabled_expert, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < static_cast<int64_t>(n) * hidden; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / hidden;
    float v = out[i];
    for (int r = 0; r < k; ++r) {
      const int j = p.token_pairs[t * k + r];
      if (p.expert[j] != disabled_expert)
        v += p.gate[j] * y[static_cast<int64_t>(j) * hidden + i % hidden];
    }
    out[i] = v;
  }
}

}  // namespace

bool grouped_gemv_supported(int in_cols, int num_experts) {
  return in_cols % 8 == 0 && num_experts <= kMaxGroupedExperts;
}

void sort_pairs(const int32_t* experts, const float* gates, int n, int k, int num_experts,
                const MoePairs& pairs, cudaStream_t stream) {
  sort_pairs_kernel<<<1, 32, num_experts * sizeof(int32_t), stream>>>(experts, gates, n, k,
                                                                      num_experts, pairs);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void grouped_gemv(const GroupedGemv& g, const MoePairs& pairs, int n, int k, int num_experts,
                  cudaStream_t stream) {
  if (!grouped_gemv_supported(g.in_cols, num_experts)) {
    fail(ErrorKind::kUnsupported, "grouped_gemv: {} input columns (a multiple of 8) of {} experts",
         g.in_cols, num_experts);
  }
  const size_t shared = kTokens * kChunkCols * sizeof(uint16_t);
  EKVA_CUDA_CHECK(cudaFuncSetAttribute(
      grouped_gemv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  // A token routes to an expert at most once: no expert has more than n pairs.
  const dim3 grid((g.out_rows + kRowsPerBlock - 1) / kRowsPerBlock, std::min(num_experts, n * k),
                  (n + kTokens - 1) / kTokens);
  grouped_gemv_kernel<<<grid, kWarps * 32, shared, stream>>>(g, pairs);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void combine_pairs(const float* y, const MoePairs& pairs, int n, int k, int hidden,
                   int disabled_expert, float* out, cudaStream_t stream) {
  const int64_t work = static_cast<int64_t>(n) * hidden;
  const int blocks = static_cast<int>(std::min<int64_t>((work + 255) / 256, 65535));
  combine_kernel<<<blocks, 256, 0, stream>>>(y, pairs, n, k, hidden, disabled_expert, out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
