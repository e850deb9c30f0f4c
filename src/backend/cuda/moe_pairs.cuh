#pragma once
// The step's (token, expert) pairs sorted by expert, by one CTA: shared by sort_pairs and the
// router that sorts after routing a step's last token.
#include <cstdint>

#include "backend/cuda/model_ops.h"

namespace ekva::cuda {

// One CTA. Every pair finds its place by counting in shared memory (its rank among the earlier
// pairs of its expert, its expert's rank among its token's experts) rather than by a serial walk:
// one thread over 128 pairs took tens of microseconds per layer, chained through global memory.
__device__ inline void sort_pairs_block(const int32_t* experts, const float* gates, int n, int k,
                                        int num_experts, const MoePairs& p, int32_t* shared) {
  const int pairs = n * k;
  int32_t* expert_of = shared;                  // [pairs]
  int32_t* first = shared + pairs;              // [num_experts]: each expert's first pair
  int32_t* touched_rank = first + num_experts;  // [num_experts]: its place among the touched
  __shared__ int32_t touched_total;
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) first[e] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    expert_of[j] = experts[j];
    atomicAdd(&first[expert_of[j]], 1);
  }
  __syncthreads();
  // Exclusive scans of the counts and of "touched" over the experts, by the first warp: each lane
  // scans a contiguous run of experts, then the runs' sums are scanned across the warp.
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int run = (num_experts + 31) / 32;
    const int begin = min(num_experts, lane * run), end = min(num_experts, begin + run);
    int count = 0, touched = 0;
    for (int e = begin; e < end; ++e) {
      count += first[e];
      touched += first[e] > 0;
    }
    int count_before = count, touched_before = touched;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int c = __shfl_up_sync(0xffffffffu, count_before, offset);
      const int t = __shfl_up_sync(0xffffffffu, touched_before, offset);
      if (lane >= offset) {
        count_before += c;
        touched_before += t;
      }
    }
    count_before -= count;
    touched_before -= touched;
    for (int e = begin; e < end; ++e) {
      const int c = first[e];
      first[e] = count_before;
      touched_rank[e] = c > 0 ? touched_before : -1;
      count_before += c;
      touched_before += c > 0;
    }
    if (lane == 31) touched_total = touched_before;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
    if (touched_rank[e] >= 0) {
      p.touched[touched_rank[e]] = e;
      p.touched_first[touched_rank[e]] = first[e];
    }
  }
  if (threadIdx.x == 0) {
    p.touched_first[touched_total] = pairs;
    *p.num_touched = touched_total;
  }
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int e = expert_of[j], t = j / k;
    int rank = 0;  // earlier pairs of expert e: earlier tokens, as a token routes to e at most once
    for (int i = 0; i < t * k; ++i) rank += expert_of[i] == e;
    int order = 0;  // the token's experts below e
    for (int i = t * k; i < (t + 1) * k; ++i) order += expert_of[i] < e;
    const int slot = first[e] + rank;
    p.token[slot] = t;
    p.gate[slot] = gates[j];
    p.expert[slot] = e;
    p.token_pairs[t * k + order] = slot;
  }
}

}  // namespace ekva::cuda
