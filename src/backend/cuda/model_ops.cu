// The model's element-wise, normalisation, rotary, routing and expert-row operators on the device.
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t work) {
  return static_cast<int>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 65535));
}

// Grid-stride loop over [0, count).
#define EKVA_FOR_EACH(i, count)                                                              \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void embed_rows_kernel(const uint16_t* table, const int32_t* tokens, int n, int hidden,
                                  float* x) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, static_cast<int64_t>(n) * hidden) {
    const int64_t t = i / hidden;
    x[i] = bf16_bits_to_float(table[static_cast<int64_t>(tokens[t]) * hidden + i % hidden]);
  }
}

// blockDim.x threads per row, blockDim.y rows per CTA (short rows, such as QK-norm's heads, go
// several to a CTA: with one 32-thread CTA per row a multiprocessor reached its limit of CTAs
// holding half the threads it can run). The sum of squares in double, as the CPU reference takes
// it. A decode step normalises one row at a time, so the row's latency is the kernel's: every
// thread's loads are issued before any is summed, and the second pass reads L1. With delta, the row
// is first x + delta (written back to x): the residual add before the norm, in the same pass. Each
// element is read and written by the same thread in both passes.
constexpr int kNormThreads = 1024;
constexpr int kNormUnroll = 4;

// Threads per row, and rows per CTA for rows of at most 64 threads.
int norm_threads(int dim) {
  return std::min(kNormThreads, std::max(32, (dim / kNormUnroll + 31) / 32 * 32));
}
dim3 norm_block(int dim) {
  const int threads = norm_threads(dim);
  return dim3(threads, threads <= 64 ? 256 / threads : 1);
}

template <bool kAddDelta>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(float* x, const float* delta, int first_rows, int total_rows, int first_dim,
                    const float* first_weight, int dim2, const float* weight2, float eps,
                    float* out_f32, uint16_t* out_bf16, float* out_inverse_rms) {
  __shared__ double partial[kNormThreads / 32];
  const int r = blockIdx.x * blockDim.y + threadIdx.y;
  // Rows past first_rows are of a second array stored right after the first (keys after queries).
  const bool second = r >= first_rows;
  const int dim = r < total_rows ? (second ? dim2 : first_dim) : 0;  // past the end: no work
  const float* weight = second ? weight2 : first_weight;
  // The weights do not depend on the kernel before: the thread's first ones are loaded while it
  // finishes.
  float weight_ahead[kNormUnroll];
#pragma unroll
  for (int u = 0; u < kNormUnroll; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    weight_ahead[u] = i < dim && weight != nullptr ? weight[i] : 0.0f;
  }
  follow_prior_grid();
  const int64_t offset = second ? static_cast<int64_t>(first_rows) * first_dim +
                                      static_cast<int64_t>(r - first_rows) * dim2
                                : static_cast<int64_t>(r) * first_dim;
  float* row = x + offset;
  const float* row_delta = kAddDelta ? delta + offset : nullptr;
  double ss = 0.0;
  // The first pass's values (a whole row up to kNormUnroll * blockDim.x) stay in registers for
  // the write: read back after the barrier, they would cost the row a second trip to memory.
  float held[kNormUnroll] = {};
  for (int base = threadIdx.x; base < dim; base += blockDim.x * kNormUnroll) {
    float v[kNormUnroll];
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) {
      const int i = base + u * blockDim.x;
      v[u] = i < dim ? row[i] : 0.0f;
      if constexpr (kAddDelta) {
        if (i < dim) v[u] += row_delta[i];
      }
    }
    if constexpr (kAddDelta) {
#pragma unroll
      for (int u = 0; u < kNormUnroll; ++u) {
        const int i = base + u * blockDim.x;
        if (i < dim) row[i] = v[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kNormUnroll; ++u) ss += static_cast<double>(v[u]) * v[u];
    if (base == static_cast<int>(threadIdx.x)) {
#pragma unroll
      for (int u = 0; u < kNormUnroll; ++u) held[u] = v[u];
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
  const int row_warps = static_cast<int>(blockDim.x / 32);
  if (threadIdx.x % 32 == 0) partial[threadIdx.y * row_warps + threadIdx.x / 32] = ss;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < row_warps; ++w) total += partial[threadIdx.y * row_warps + w];
  const float inv = dim > 0 ? inverse_rms(total, dim, eps) : 0.0f;
  if (out_inverse_rms != nullptr) {
    if (dim > 0 && threadIdx.x == 0) out_inverse_rms[r] = inv;
    return;
  }
  const auto write = [&](int i, float value, float w) {
    const float y = rms_normed(value, inv, w);
    const int64_t at = offset + i;
    if (out_f32 != nullptr) out_f32[at] = y;
    if (out_bf16 != nullptr) out_bf16[at] = to_bf16_bits(y);
  };
#pragma unroll
  for (int u = 0; u < kNormUnroll; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    if (i < dim) write(i, held[u], weight_ahead[u]);
  }
  for (int i = threadIdx.x + kNormUnroll * blockDim.x; i < dim; i += blockDim.x) {
    write(i, row[i], weight[i]);
  }
}

template <bool kAddDelta>
void launch_rms_norm(float* x, const float* delta, int rows, int dim, const float* weight,
                     int rows2, int dim2, const float* weight2, float eps, float* out_f32,
                     uint16_t* out_bf16, float* out_inverse_rms, cudaStream_t stream) {
  const int total = rows + rows2;
  if (total == 0) return;
  const dim3 block = norm_block(std::max(dim, dim2));
  launch_overlapping(rms_norm_kernel<kAddDelta>,
                     dim3(static_cast<unsigned>((total + block.y - 1) / block.y)), block, 0, stream,
                     x, delta, rows, total, dim, weight, dim2, weight2, eps, out_f32, out_bf16,
                     out_inverse_rms);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

__global__ void add_bias_kernel(float* y, const float* bias, int rows, int cols) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, static_cast<int64_t>(rows) * cols) y[i] += bias[i % cols];
}

__global__ void clamp_kernel(float* x, int64_t count, float limit) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, count) x[i] = fminf(fmaxf(x[i], -limit), limit);
}

__global__ void to_bf16_kernel(const float* x, int64_t count, uint16_t* out) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, count) out[i] = to_bf16_bits(x[i]);
}

// One warp per token. The probabilities as Router::route forms them (max, exp, sum, divide), then
// top_k rounds of a warp arg-max with ties to the lower id.
constexpr int kMaxExpertsPerLane = 8;  // 256 experts

struct RoutePick {
  int expert;
  float gate;
};

// One warp routes one token from its logits l (in global or shared memory). Lane i < top_k returns
// the i-th pick.
__device__ RoutePick route_token(const float* l, int num_experts, int top_k, bool renormalise,
                                 int32_t* experts, float* gates) {
  const int lane = threadIdx.x % 32;
  float p[kMaxExpertsPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int j = 0; j < kMaxExpertsPerLane; ++j) {
    const int e = lane + 32 * j;
    // Non-finite logits as Router::route takes them: the nearest finite value, NaN the lowest (a
    // NaN probability would leave a pick at no expert, an index past the experts' weights).
    p[j] = e < num_experts ? fminf(fmaxf(l[e], -FLT_MAX), FLT_MAX) : -FLT_MAX;
    mx = fmaxf(mx, p[j]);
  }
  for (int offset = 16; offset > 0; offset /= 2)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxExpertsPerLane; ++j) {
    p[j] = lane + 32 * j < num_experts ? expf(p[j] - mx) : 0.0f;
    sum += p[j];
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
#pragma unroll
  for (int j = 0; j < kMaxExpertsPerLane; ++j)
    p[j] = lane + 32 * j < num_experts ? p[j] / sum : -1.0f;

  float top_sum = 0.0f;
  float chosen_p = 0.0f;  // lane i < top_k keeps the i-th pick
  int chosen_e = 0;
  for (int k = 0; k < top_k; ++k) {
    float best = -1.0f;
    int best_e = num_experts;
#pragma unroll
    for (int j = 0; j < kMaxExpertsPerLane; ++j) {
      const int e = lane + 32 * j;
      if (p[j] > best) {  // ascending e within a lane: ties keep the lower id
        best = p[j];
        best_e = e;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int other_e = __shfl_xor_sync(0xffffffffu, best_e, offset);
      if (other > best || (other == best && other_e < best_e)) {
        best = other;
        best_e = other_e;
      }
    }
    if (lane == k) {
      chosen_p = best;
      chosen_e = best_e;
    }
    top_sum += best;
    if (best_e % 32 == lane) p[best_e / 32] = -1.0f;
  }
  const RoutePick pick{chosen_e, renormalise ? chosen_p / top_sum : chosen_p};
  if (lane < top_k) {
    experts[lane] = pick.expert;
    gates[lane] = pick.gate;
  }
  return pick;
}

__global__ void route_kernel(const float* logits, int n, int num_experts, int top_k,
                             bool renormalise, int32_t* experts, float* gates) {
  follow_prior_grid();
  const int token = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (token >= n) return;
  route_token(logits + static_cast<int64_t>(token) * num_experts, num_experts, top_k, renormalise,
              experts + static_cast<int64_t>(token) * top_k,
              gates + static_cast<int64_t>(token) * top_k);
}

// Grid (experts x slices, tokens): CTA (e * slices + s, t) takes slice s of the dot product of
// token t's row with expert e's, spread over the CTA's threads, whose loads are all issued before
// any is summed (a decode step's router is latency-bound: more, shorter slices keep more loads in
// flight). The CTA that finishes a token's last slice adds each logit's slices in order and routes
// the token; counters[t] counts the finished slices and is left at zero for the next call.
constexpr int kRouterThreads = 128;
constexpr int kRouterUnroll = 4;
constexpr int kMaxRouterSlices = 16;
__global__ void __launch_bounds__(kRouterThreads)
    route_experts_kernel(const float* x, const float* w, int hidden, int num_experts, int slices,
                         int top_k, bool renormalise, float* logits, int32_t* experts, float* gates,
                         uint32_t* workspace, const MoePairs one_token_pairs) {
  __shared__ float partial[kRouterThreads / 32];
  __shared__ float token_logits[32 * kMaxExpertsPerLane];  // the last CTA's
  __shared__ float token_partials[kRouterPartials];        // the last CTA's
  __shared__ bool last;
  const int e = blockIdx.x / slices, s = blockIdx.x % slices, token = blockIdx.y;
  const int quads = hidden / 4 / slices;
  const auto* xv =
      reinterpret_cast<const float4*>(x + static_cast<int64_t>(token) * hidden) + s * quads;
  const auto* wv =
      reinterpret_cast<const float4*>(w + static_cast<int64_t>(e) * hidden) + s * quads;
  // The router's weights do not depend on the kernel before: the first ones are loaded while it
  // finishes.
  float4 b[kRouterUnroll];
  const auto load_weights = [&](int base) {
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) {
      const int i = base + u * kRouterThreads;
      b[u] = i < quads ? wv[i] : float4{};
    }
  };
  load_weights(threadIdx.x);
  follow_prior_grid();
  float sum = 0.0f;
  for (int base = threadIdx.x; base < quads; base += kRouterThreads * kRouterUnroll) {
    if (base != static_cast<int>(threadIdx.x)) load_weights(base);
    float4 a[kRouterUnroll];
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u) {
      const int i = base + u * kRouterThreads;
      a[u] = i < quads ? xv[i] : float4{};
    }
#pragma unroll
    for (int u = 0; u < kRouterUnroll; ++u)
      sum += a[u].x * b[u].x + a[u].y * b[u].y + a[u].z * b[u].z + a[u].w * b[u].w;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = sum;
  __syncthreads();
  uint32_t* counters = workspace;
  float* partials = reinterpret_cast<float*>(workspace + kMaxRoutedTokens) +
                    static_cast<int64_t>(token) * kRouterPartials;
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int i = 0; i < kRouterThreads / 32; ++i) total += partial[i];
    partials[blockIdx.x] = total;
    __threadfence();  // the slice's sum before its count
    last = atomicAdd(counters + token, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // every slice of the token is visible once its count is complete
  // Every slice's sum in one round of loads, a thread per slice, then each logit's slices added in
  // order: a thread per logit loading its slices itself waited for Mixtral's 16 in four rounds.
  for (int i = threadIdx.x; i < num_experts * slices; i += kRouterThreads) {
    token_partials[i] = __ldcg(partials + i);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < num_experts; i += kRouterThreads) {
    float logit = 0.0f;
    for (int j = 0; j < slices; ++j) logit += token_partials[i * slices + j];
    logits[static_cast<int64_t>(token) * num_experts + i] = logit;
    token_logits[i] = logit;
  }
  __syncthreads();
  if (warp != 0) return;
  const auto [expert, gate] = route_token(token_logits, num_experts, top_k, renormalise,
                                          experts + static_cast<int64_t>(token) * top_k,
                                          gates + static_cast<int64_t>(token) * top_k);
  if (lane == 0) counters[token] = 0;
  if (one_token_pairs.token == nullptr) return;
  // The token's picks are distinct experts: a pick's slot is the number of picks below it, and
  // each pair is a group of its own.
  const MoePairs& p = one_token_pairs;
  int slot = 0;
  for (int i = 0; i < top_k; ++i) slot += __shfl_sync(0xffffffffu, expert, i) < expert;
  if (lane < top_k) {
    p.token[slot] = 0;
    p.gate[slot] = gate;
    p.expert[slot] = expert;
    p.token_pairs[slot] = slot;
    p.group_expert[slot] = expert;
    p.group_first[slot] = slot;
  }
  if (lane == 0) {
    p.group_first[top_k] = top_k;
    *p.num_groups = top_k;
  }
}

// Slices of the hidden size per logit: a power of two, as many as keep experts x slices within
// about one CTA per multiprocessor for one token, each a whole number of float4s. Every CTA of a
// token adds to one counter, whose atomics serialise: a router of 128 experts cut in two was
// slower than one of 128 whole dot products.
constexpr int kRouterCtasPerToken = 128;
int router_slices(int hidden, int num_experts) {
  int slices = 1;
  while (slices * 2 <= kMaxRouterSlices && num_experts * slices * 2 <= kRouterCtasPerToken &&
         hidden % (4 * slices * 2) == 0) {
    slices *= 2;
  }
  return slices;
}

__global__ void gather_rows_kernel(const uint16_t* x, const int32_t* rows, int count, int cols,
                                   uint16_t* out) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, static_cast<int64_t>(count) * cols) {
    out[i] = x[static_cast<int64_t>(rows[i / cols]) * cols + i % cols];
  }
}

// As cpu::silu_mul: gate / (1 + exp(-gate)) * up. grid: (column blocks, rows), so that no thread
// divides a 64-bit flat index by the row length for every element. A thread takes four columns,
// as 16-byte loads and one 8-byte store where the row length allows them: scalar accesses left a
// Mixtral-sized prompt's SwiGLU at under half the read bandwidth.
template <bool kVector>
__global__ void silu_mul_kernel(const float* gate_up, int rows, int inter, uint16_t* out) {
  follow_prior_grid();
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* gate = gate_up + r * 2 * inter;
    uint16_t* row_out = out + r * inter;
    for (int c = 4 * (blockIdx.x * blockDim.x + threadIdx.x); c < inter;
         c += 4 * gridDim.x * blockDim.x) {
      if constexpr (kVector) {
        const float4 g = *reinterpret_cast<const float4*>(gate + c);
        const float4 u = *reinterpret_cast<const float4*>(gate + inter + c);
        const auto pair = [](uint16_t lo, uint16_t hi) { return lo | (uint32_t{hi} << 16); };
        *reinterpret_cast<uint2*>(row_out + c) =
            make_uint2(pair(swiglu_bf16(g.x, u.x), swiglu_bf16(g.y, u.y)),
                       pair(swiglu_bf16(g.z, u.z), swiglu_bf16(g.w, u.w)));
      } else {
        for (int j = c; j < min(c + 4, inter); ++j)
          row_out[j] = swiglu_bf16(gate[j], gate[inter + j]);
      }
    }
  }
}

__global__ void scatter_add_rows_kernel(const float* y, const int32_t* rows, const float* weights,
                                        int count, int cols, float* out) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, static_cast<int64_t>(count) * cols) {
    const int64_t r = i / cols;
    const int64_t dst = rows != nullptr ? rows[r] : r;
    const float w = weights != nullptr ? weights[r] : 1.0f;
    out[dst * cols + i % cols] += w * y[i];
  }
}

__global__ void sigmoid_kernel(float* x, int count) {
  follow_prior_grid();
  EKVA_FOR_EACH(i, count) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

// splitmix64 of (seed, index), as a uniform in [-1, 1).
__device__ __forceinline__ float uniform_pm1(uint64_t seed, int64_t index) {
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Uniform on [-a, a] has standard deviation a / sqrt(3).
__global__ void fill_random_bf16_kernel(uint16_t* x, int64_t count, uint64_t seed, float a) {
  EKVA_FOR_EACH(i, count) x[i] = to_bf16_bits(a * uniform_pm1(seed, i));
}
__global__ void fill_random_f32_kernel(float* x, int64_t count, uint64_t seed, float a) {
  EKVA_FOR_EACH(i, count) x[i] = a * uniform_pm1(seed, i);
}
__global__ void fill_constant_kernel(float* x, int64_t count, float value) {
  EKVA_FOR_EACH(i, count) x[i] = value;
}

#undef EKVA_FOR_EACH

}  // namespace

void embed_rows(const uint16_t* table, const int32_t* tokens, int n, int hidden, float* x,
                cudaStream_t stream) {
  launch_overlapping(embed_rows_kernel, dim3(grid_for(static_cast<int64_t>(n) * hidden)),
                     dim3(kThreads), 0, stream, table, tokens, n, hidden, x);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void rms_norm(const float* x, int rows, int dim, const float* weight, float eps, float* out_f32,
              uint16_t* out_bf16, cudaStream_t stream) {
  // The kernel writes x only when it adds a delta.
  launch_rms_norm<false>(const_cast<float*>(x), nullptr, rows, dim, weight, 0, dim, weight, eps,
                         out_f32, out_bf16, nullptr, stream);
}

void rms_norm_pair(float* x, int rows, int dim, const float* weight, int rows2, int dim2,
                   const float* weight2, float eps, cudaStream_t stream) {
  launch_rms_norm<false>(x, nullptr, rows, dim, weight, rows2, dim2, weight2, eps, x, nullptr,
                         nullptr, stream);
}

void inverse_rms_pair(const float* x, int rows, int dim, int rows2, int dim2, float eps,
                      float* inverse_rms, cudaStream_t stream) {
  launch_rms_norm<false>(const_cast<float*>(x), nullptr, rows, dim, nullptr, rows2, dim2, nullptr,
                         eps, nullptr, nullptr, inverse_rms, stream);
}

void add_rms_norm(float* x, const float* delta, int rows, int dim, const float* weight, float eps,
                  float* out_f32, uint16_t* out_bf16, cudaStream_t stream) {
  launch_rms_norm<true>(x, delta, rows, dim, weight, 0, dim, weight, eps, out_f32, out_bf16,
                        nullptr, stream);
}

void add_bias(float* y, const float* bias, int rows, int cols, cudaStream_t stream) {
  launch_overlapping(add_bias_kernel, dim3(grid_for(static_cast<int64_t>(rows) * cols)),
                     dim3(kThreads), 0, stream, y, bias, rows, cols);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void clamp_in_place(float* x, int64_t count, float limit, cudaStream_t stream) {
  launch_overlapping(clamp_kernel, dim3(grid_for(count)), dim3(kThreads), 0, stream, x, count,
                     limit);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream) {
  launch_overlapping(to_bf16_kernel, dim3(grid_for(count)), dim3(kThreads), 0, stream, x, count,
                     out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

bool route_experts_supported(int n, int hidden, int num_experts) {
  return n <= kMaxRoutedTokens && hidden % 4 == 0 && num_experts >= 1 &&
         num_experts <= 32 * kMaxExpertsPerLane;
}

void route_experts(const float* x, const float* router, int n, int hidden, int num_experts,
                   int top_k, bool renormalise, float* logits, int32_t* experts, float* gates,
                   uint32_t* workspace, const MoePairs* one_token_pairs, cudaStream_t stream) {
  if (!route_experts_supported(n, hidden, num_experts) || top_k > 32 || top_k > num_experts ||
      (one_token_pairs != nullptr && n != 1)) {
    fail(ErrorKind::kUnsupported,
         "route_experts: {} tokens (at most {}), hidden size {} (a multiple of 4), {} experts (at "
         "most {}), top-{}{}",
         n, kMaxRoutedTokens, hidden, num_experts, 32 * kMaxExpertsPerLane, top_k,
         one_token_pairs != nullptr ? ", pairs written for one token only" : "");
  }
  if (n == 0) return;
  const int slices = router_slices(hidden, num_experts);
  launch_overlapping(route_experts_kernel, dim3(num_experts * slices, n), dim3(kRouterThreads), 0,
                     stream, x, router, hidden, num_experts, slices, top_k, renormalise, logits,
                     experts, gates, workspace,
                     one_token_pairs != nullptr ? *one_token_pairs : MoePairs{});
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void route_tokens(const float* logits, int n, int num_experts, int top_k, bool renormalise,
                  int32_t* experts, float* gates, cudaStream_t stream) {
  if (num_experts > 32 * kMaxExpertsPerLane || top_k > 32) {
    EKVA_CUDA_CHECK(cudaErrorInvalidValue);
  }
  constexpr int kWarps = kThreads / 32;
  launch_overlapping(route_kernel, dim3((n + kWarps - 1) / kWarps), dim3(kThreads), 0, stream,
                     logits, n, num_experts, top_k, renormalise, experts, gates);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void gather_rows(const uint16_t* x, const int32_t* rows, int count, int cols, uint16_t* out,
                 cudaStream_t stream) {
  launch_overlapping(gather_rows_kernel, dim3(grid_for(static_cast<int64_t>(count) * cols)),
                     dim3(kThreads), 0, stream, x, rows, count, cols, out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void silu_mul(const float* gate_up, int rows, int inter, uint16_t* out, cudaStream_t stream) {
  if (rows == 0 || inter == 0) return;
  const dim3 grid((inter + 4 * kThreads - 1) / (4 * kThreads), std::min(rows, 65535));
  // Rows of a multiple of four columns keep every row's 16-byte and 8-byte accesses aligned.
  if (inter % 4 == 0) {
    launch_overlapping(silu_mul_kernel<true>, grid, dim3(kThreads), 0, stream, gate_up, rows, inter,
                       out);
  } else {
    launch_overlapping(silu_mul_kernel<false>, grid, dim3(kThreads), 0, stream, gate_up, rows,
                       inter, out);
  }
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_rows(const float* y, const int32_t* rows, const float* weights, int count,
                      int cols, float* out, cudaStream_t stream) {
  launch_overlapping(scatter_add_rows_kernel, dim3(grid_for(static_cast<int64_t>(count) * cols)),
                     dim3(kThreads), 0, stream, y, rows, weights, count, cols, out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void fill_random_bf16(uint16_t* x, int64_t count, uint64_t seed, float stddev,
                      cudaStream_t stream) {
  fill_random_bf16_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, seed,
                                                                    stddev * 1.7320508f);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void fill_random_f32(float* x, int64_t count, uint64_t seed, float stddev, cudaStream_t stream) {
  fill_random_f32_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, seed,
                                                                   stddev * 1.7320508f);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void fill_constant(float* x, int64_t count, float value, cudaStream_t stream) {
  fill_constant_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, value);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

void sigmoid_in_place(float* x, int count, cudaStream_t stream) {
  launch_overlapping(sigmoid_kernel, dim3(grid_for(count)), dim3(kThreads), 0, stream, x, count);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
