// Attention of any batch of tokens (prefill, decode, or both) over the paged KV pool, causal by
// each slot's stored position: the general path that every step can take. One warp per (token,
// query head): the lanes score 32 slots at a time with an online softmax, then share the V rows.
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;

// The masked logit of one slot for the warp's query, or -inf where the slot's position is after the
// query's or the slot is past the segment.
__device__ __forceinline__ float slot_logit(const PagedKvLayer& kv, const int32_t* table,
                                            int length, int slot, int32_t query_pos, const float* q,
                                            float scale, int64_t* row_out) {
  if (slot >= length) return -INFINITY;
  const int64_t row = pool_row(table, slot, kv.page_size);
  *row_out = row;
  if (kv.meta[row].position > query_pos) return -INFINITY;
  const uint16_t* k = kv.pool + key_offset(row, kv.page_size, kv.head_dim);
  float dot = 0.0f;
  for (int j = 0; j < kv.head_dim; ++j) dot += q[j] * bf16_bits_to_float(k[j]);
  return dot * scale;
}

template <int kDimsPerLane>
__global__ void __launch_bounds__(kWarps * 32)
    paged_attention_kernel(const PagedKvLayer kv, const PagedAttention a, float scale) {
  __shared__ float q_shared[kWarps][kMaxHeadDim];
  const int lane = threadIdx.x % 32;
  const int warp_in_cta = threadIdx.x / 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp_in_cta;
  if (item >= static_cast<int64_t>(a.n) * a.num_q_heads) return;
  const int t =
      a.tokens != nullptr ? a.tokens[item / a.num_q_heads] : static_cast<int>(item / a.num_q_heads);
  const int h = static_cast<int>(item % a.num_q_heads);
  const int64_t at = (static_cast<int64_t>(t) * a.num_q_heads + h) * kv.head_dim;
  const int group = a.num_q_heads / kv.num_kv_heads;
  const int segment = a.sequences[t] * kv.num_kv_heads + h / group;
  const int32_t* table = kv.page_ids + kv.page_offsets[segment];
  const int length = kv.lengths[segment];
  const int32_t query_pos = a.positions[t];
  const int d = kv.head_dim;
  float* q = q_shared[warp_in_cta];
  for (int j = lane; j < d; j += 32) q[j] = a.q[at + j];
  __syncwarp();

  float m = -INFINITY;
  float l = 0.0f;
  float acc[kDimsPerLane] = {};
  for (int base = 0; base < length; base += 32) {
    int64_t row = 0;
    const float s = slot_logit(kv, table, length, base + lane, query_pos, q, scale, &row);
    float chunk_max = s;
    for (int offset = 16; offset > 0; offset /= 2)
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
    const float m_new = fmaxf(m, chunk_max);
    if (m_new == -INFINITY) continue;  // nothing visible yet
    const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
    const float correction = m == -INFINITY ? 0.0f : expf(m - m_new);
    float p_sum = p;
    for (int offset = 16; offset > 0; offset /= 2)
      p_sum += __shfl_xor_sync(0xffffffffu, p_sum, offset);
    l = l * correction + p_sum;
#pragma unroll
    for (int k = 0; k < kDimsPerLane; ++k) acc[k] *= correction;
    for (int j = 0; j < 32; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const int64_t row_j = __shfl_sync(0xffffffffu, row, j);
      if (pj == 0.0f) continue;  // the same for every lane
      const uint16_t* v =
          kv.pool + key_offset(row_j, kv.page_size, d) + static_cast<int64_t>(kv.page_size) * d;
#pragma unroll
      for (int k = 0; k < kDimsPerLane; ++k) {
        const int dim = lane + 32 * k;
        if (dim < d) acc[k] += pj * bf16_bits_to_float(v[dim]);
      }
    }
    m = m_new;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int k = 0; k < kDimsPerLane; ++k) {
    const int dim = lane + 32 * k;
    if (dim < d) a.out[at + dim] = to_bf16_bits(acc[k] * inv);
  }
  if (a.score_delta == nullptr || a.score_query == nullptr || a.score_query[t] == 0 || l == 0.0f)
    return;
  for (int slot = lane; slot < length; slot += 32) {
    int64_t row = 0;
    const float s = slot_logit(kv, table, length, slot, query_pos, q, scale, &row);
    if (s != -INFINITY) atomicAdd(a.score_delta + row, expf(s - m) * inv);
  }
}

}  // namespace

void fail_unsupported_head_dim(int head_dim) {
  fail(ErrorKind::kUnsupported,
       "CUDA attention: head_dim {} is not implemented (an even head_dim up to {})", head_dim,
       kMaxHeadDim);
}

void paged_attention(const PagedKvLayer& kv, const PagedAttention& a, cudaStream_t stream) {
  if (a.n == 0) return;
  if (kv.meta == nullptr || a.num_q_heads % kv.num_kv_heads != 0) {
    fail(ErrorKind::kInvalidArgument,
         "paged_attention: needs slot metadata and query heads ({}) a multiple of KV heads ({})",
         a.num_q_heads, kv.num_kv_heads);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  const int64_t items = static_cast<int64_t>(a.n) * a.num_q_heads;
  const auto blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  dispatch_dims_per_lane(kv.head_dim, [&](auto dims) {
    paged_attention_kernel<decltype(dims)::value><<<blocks, kWarps * 32, 0, stream>>>(kv, a, scale);
  });
  EKVA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ekva::cuda
