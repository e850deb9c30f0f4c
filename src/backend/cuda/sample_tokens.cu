// Tokens drawn where the logits are (draw_token's definition): each sampled row sorted best first
// by a segmented radix sort, then one CTA per row walks its candidates in that order.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda/functional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

constexpr int kDrawThreads = 256;
constexpr int kDrawItems = 8;  // consecutive candidates per thread in a pass
constexpr int kDrawChunk = kDrawThreads * kDrawItems;

// The sort's inputs: the logits with -0 as +0 (draw_token compares them as equal, and a stable
// radix sort then keeps equal logits in ascending id order), their ids, and the row offsets.
__global__ void sort_inputs_kernel(const float* logits, int64_t count, int vocab, int rows,
                                   float* keys, int32_t* ids, int32_t* offsets) {
  follow_prior_grid();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[i] = logits[i] + 0.0f;
    ids[i] = static_cast<int32_t>(i % vocab);
  }
  if (blockIdx.x == 0) {
    for (int r = threadIdx.x; r <= rows; r += blockDim.x) offsets[r] = r * vocab;
  }
}

struct DrawPass {
  double carry;  // weight before the chunk
  int found;     // the first candidate meeting the condition, INT_MAX: none yet
};

// One pass over candidates [0, keep) in order: the first i whose running weight (inclusive)
// meets `reached`, or INT_MAX; *total gets the weight of all of them when none does.
template <typename Reached>
__device__ int first_reaching(const float* keys, int keep, double mx, double temperature,
                              Reached reached, double* total) {
  using Scan = cub::BlockScan<double, kDrawThreads>;
  using Reduce = cub::BlockReduce<int, kDrawThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ typename Reduce::TempStorage reduce;
  __shared__ int found;
  double carry = 0.0;
  for (int base = 0; base < keep; base += kDrawChunk) {
    const int first = base + threadIdx.x * kDrawItems;
    double w[kDrawItems];
    double local = 0.0;
#pragma unroll
    for (int j = 0; j < kDrawItems; ++j) {
      w[j] =
          first + j < keep ? exp((static_cast<double>(keys[first + j]) - mx) / temperature) : 0.0;
      local += w[j];
    }
    double before, chunk;
    Scan(scan).ExclusiveSum(local, before, chunk);
    double running = carry + before;
    int mine = INT_MAX;
#pragma unroll
    for (int j = 0; j < kDrawItems; ++j) {
      running += w[j];
      if (mine == INT_MAX && first + j < keep && reached(running)) mine = first + j;
    }
    const int best = Reduce(reduce).Reduce(mine, ::cuda::minimum<>{});
    if (threadIdx.x == 0) found = best;
    __syncthreads();
    const int hit = found;
    __syncthreads();  // `found` and the temporaries are reused by the next chunk
    if (hit != INT_MAX) return hit;
    carry += chunk;
  }
  *total = carry;
  return INT_MAX;
}

// The running weight of candidates [0, count) in order, summed as first_reaching sums them.
__device__ double weight_through(const float* keys, int count, double mx, double temperature) {
  double total = 0.0;
  first_reaching(
      keys, count, mx, temperature, [](double) { return false; }, &total);
  return total;
}

__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(const float* keys, const int32_t* ids, int vocab, const TokenDraw* draws,
                int32_t* tokens) {
  follow_prior_grid();
  const int row = blockIdx.x;
  const TokenDraw d = draws[row];
  if (d.temperature <= 0.0f || tokens[row] < 0) return;
  const float* k = keys + static_cast<int64_t>(row) * vocab;
  const double mx = k[0], temperature = d.temperature;
  int keep = d.top_k > 0 ? min(d.top_k, vocab) : vocab;
  double mass = weight_through(k, keep, mx, temperature);
  if (d.top_p < 1.0f) {
    const double p = d.top_p, sum = mass;
    double unused = 0.0;
    const int cut = first_reaching(
        k, keep, mx, temperature, [=](double running) { return running / sum >= p; }, &unused);
    if (cut != INT_MAX) {
      keep = cut + 1;
      mass = weight_through(k, keep, mx, temperature);
    }
  }
  const double target = d.u * mass;
  double unused = 0.0;
  const int pick = first_reaching(
      k, keep, mx, temperature, [=](double running) { return running > target; }, &unused);
  if (threadIdx.x == 0) {
    tokens[row] = ids[static_cast<int64_t>(row) * vocab + (pick == INT_MAX ? keep - 1 : pick)];
  }
}

struct SortBuffers {
  float* keys_in;
  float* keys_out;
  int32_t* ids_in;
  int32_t* ids_out;
  int32_t* offsets;
  void* temp;
  size_t temp_bytes;
  size_t total;
};

size_t align_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// The workspace's parts at `base` (null: only the sizes).
SortBuffers sort_buffers(char* base, int rows, int vocab) {
  const size_t count = static_cast<size_t>(rows) * vocab;
  SortBuffers b{};
  size_t at = 0;
  const auto take = [&](size_t bytes) {
    char* p = base == nullptr ? nullptr : base + at;
    at += align_up(bytes);
    return p;
  };
  b.keys_in = reinterpret_cast<float*>(take(count * sizeof(float)));
  b.keys_out = reinterpret_cast<float*>(take(count * sizeof(float)));
  b.ids_in = reinterpret_cast<int32_t*>(take(count * sizeof(int32_t)));
  b.ids_out = reinterpret_cast<int32_t*>(take(count * sizeof(int32_t)));
  b.offsets = reinterpret_cast<int32_t*>(take((rows + 1) * sizeof(int32_t)));
  EKVA_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, b.temp_bytes, b.keys_in, b.keys_out, b.ids_in, b.ids_out, static_cast<int>(count),
      rows, b.offsets, b.offsets + 1));
  b.temp = take(b.temp_bytes);
  b.total = at;
  return b;
}

void check_shape(int rows, int vocab) {
  if (rows < 0 || vocab <= 0 || static_cast<int64_t>(rows) * vocab >= INT_MAX) {
    fail(ErrorKind::kUnsupported, "sample_tokens: {} rows of {} logits (fewer than 2^31 in all)",
         rows, vocab);
  }
}

}  // namespace

size_t sample_tokens_workspace(int rows, int vocab) {
  check_shape(rows, vocab);
  return sort_buffers(nullptr, rows, vocab).total;
}

void sample_tokens(const float* logits, int rows, int vocab, const TokenDraw* draws,
                   void* workspace, size_t workspace_bytes, int32_t* tokens, cudaStream_t stream) {
  check_shape(rows, vocab);
  if (rows == 0) return;
  SortBuffers b = sort_buffers(static_cast<char*>(workspace), rows, vocab);
  if (workspace_bytes < b.total) {
    fail(ErrorKind::kInvalidArgument, "sample_tokens: a workspace of {} bytes, {} needed",
         workspace_bytes, b.total);
  }
  const int64_t count = static_cast<int64_t>(rows) * vocab;
  const int blocks = static_cast<int>(std::min<int64_t>((count + 255) / 256, 65535));
  launch_overlapping(sort_inputs_kernel, dim3(blocks), dim3(256), 0, stream, logits, count, vocab,
                     rows, b.keys_in, b.ids_in, b.offsets);
  EKVA_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      b.temp, b.temp_bytes, b.keys_in, b.keys_out, b.ids_in, b.ids_out, static_cast<int>(count),
      rows, b.offsets, b.offsets + 1, 0, static_cast<int>(sizeof(float) * 8), stream));
  launch_overlapping(draw_kernel, dim3(rows), dim3(kDrawThreads), 0, stream, b.keys_out, b.ids_out,
                     vocab, draws, tokens);
}

}  // namespace ekva::cuda
