// Tokens drawn where the logits are (draw_token's definition). The greedy token of every row comes
// first: a row's chunks go to CTAs of their own, each loading all its entries before comparing any
// (a vocabulary's row is hundreds of kB, too much for one CTA's loads in flight), and the CTA that
// completes a row's chunks reduces their bests. A sampled draw without cuts walks its row
// in id order; one with cuts reaches only a prefix of its candidates best first: the top-k, or
// those before the top-p cut or the drawn token. One
// CTA per row bounds that prefix from a histogram of the weights and keeps the candidates above the
// bound, a segmented sort orders them, and one CTA per row walks them.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <cuda/functional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/model_ops.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

constexpr int kSelectThreads = 1024;
// Buckets of equal width between the row's largest and smallest logits: a bucket holds candidates
// of strictly higher logits than any later bucket's, and however narrow the logits' spread (random
// weights give nearly equal ones) the kept prefix stays close to what the draw needs.
constexpr int kBuckets = 2048;
// The bound keeps every candidate whose better candidates weigh at most this much more than the
// draw can need: the buckets' float sums are off by far less.
constexpr double kMassMargin = 1.05;

constexpr int kDrawThreads = 256;
constexpr int kDrawItems = 8;  // consecutive candidates per thread in a pass
constexpr int kDrawChunk = kDrawThreads * kDrawItems;

// A candidate as one 64-bit key, larger is better: the logit's bits made to order as unsigned
// (-0 as +0, which draw_token compares as equal), then the complement of the id, so that equal
// logits put the lower id first and no two keys are equal.
__device__ __forceinline__ uint64_t candidate_key(float logit, int id) {
  uint32_t bits = __float_as_uint(logit + 0.0f);
  bits = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ float candidate_logit(uint64_t key) {
  const uint32_t bits = static_cast<uint32_t>(key >> 32);
  return __uint_as_float((bits & 0x80000000u) != 0 ? bits & 0x7fffffffu : ~bits);
}
__device__ __forceinline__ int candidate_id(uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
}

constexpr int kGreedyThreads = 256;
constexpr int kGreedyItems = 16;  // entries per thread
constexpr int kGreedyChunk = kGreedyThreads * kGreedyItems;

// Larger is better: a finite entry's candidate key, below every entry that is not finite, of which
// the earlier is the larger; 0 for no entry.
__device__ __forceinline__ uint64_t greedy_key(float logit, int id) {
  return isfinite(logit) ? candidate_key(logit, id)
                         : 0xffffffff00000000ull | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ uint64_t warp_max(uint64_t key) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, key, offset);
    key = other > key ? other : key;
  }
  return key;
}

// CTA (c, r): chunk c of row r. chunk_keys: [rows, chunks]; row_counters: [rows], zero on entry.
__global__ void __launch_bounds__(kGreedyThreads)
    greedy_kernel(const float* logits, int vocab, uint64_t* chunk_keys, int* row_counters,
                  int32_t* out) {
  __shared__ uint64_t warp_keys[kGreedyThreads / 32];
  follow_prior_grid();
  const int row = blockIdx.y;
  const int chunks = static_cast<int>(gridDim.x);
  const float* x = logits + static_cast<int64_t>(row) * vocab;
  const int first = static_cast<int>(blockIdx.x) * kGreedyChunk + static_cast<int>(threadIdx.x);
  float v[kGreedyItems];
#pragma unroll
  for (int u = 0; u < kGreedyItems; ++u) {
    v[u] = x[min(first + u * kGreedyThreads, vocab - 1)];  // unconditional: all in flight at once
  }
  uint64_t key = 0;
#pragma unroll
  for (int u = 0; u < kGreedyItems; ++u) {
    const int i = first + u * kGreedyThreads;
    const uint64_t k = i < vocab ? greedy_key(v[u], i) : 0;
    key = k > key ? k : key;
  }
  key = warp_max(key);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) warp_keys[warp] = key;
  __syncthreads();
  uint64_t* row_keys = chunk_keys + static_cast<int64_t>(row) * chunks;
  bool last = false;
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGreedyThreads / 32; ++w) key = warp_keys[w] > key ? warp_keys[w] : key;
    row_keys[blockIdx.x] = key;
    // Acquire-release: this chunk's key before the count, the other chunks' before the reduction.
    last = count_in(row_counters + row) == chunks - 1;
  }
  if (!__syncthreads_or(last) || warp != 0) return;
  uint64_t best = 0;
  for (int c = lane; c < chunks; c += 32) {
    const uint64_t k = __ldcg(row_keys + c);  // written by other CTAs in this launch: not from L1
    best = k > best ? k : best;
  }
  best = warp_max(best);
  if (lane == 0) {
    const int id = candidate_id(best);
    out[row] = static_cast<uint32_t>(best >> 32) == 0xffffffffu ? -1 - id : id;
    row_counters[row] = 0;
  }
}

// The draw's top-k, 0 when it keeps every candidate.
__device__ __forceinline__ int kept_top_k(const TokenDraw& d, int vocab) {
  return d.top_k > 0 && d.top_k < vocab ? d.top_k : 0;
}
// Without top-k or top-p the draw walks the row in id order (draw_token): nothing to sort.
__device__ __forceinline__ bool walks_in_id_order(const TokenDraw& d, int vocab) {
  return kept_top_k(d, vocab) == 0 && d.top_p >= 1.0f;
}

// One CTA per row (sampled rows only: others get no candidates). Writes the kept candidates' keys
// at the row's place in `keys`, the segment's end to ends[row], and the weight of every candidate
// to totals[row] (what the draw needs when it keeps them all).
__global__ void __launch_bounds__(kSelectThreads)
    select_candidates_kernel(const float* logits, int vocab, const TokenDraw* draws,
                             const int32_t* tokens, uint64_t* keys, int32_t* begins, int32_t* ends,
                             double* totals) {
  follow_prior_grid();
  using Reduce = cub::BlockReduce<double, kSelectThreads>;
  using ReduceMin = cub::BlockReduce<float, kSelectThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  __shared__ typename ReduceMin::TempStorage reduce_min;
  __shared__ float lowest;
  __shared__ float bucket_mass[kBuckets];
  __shared__ int bucket_count[kBuckets];
  __shared__ int last_bucket;
  __shared__ int kept;
  const int row = blockIdx.x;
  const int64_t base = static_cast<int64_t>(row) * vocab;
  if (threadIdx.x == 0) begins[row] = static_cast<int32_t>(base);
  const TokenDraw d = draws[row];
  if (d.temperature <= 0.0f || tokens[row] < 0) {
    if (threadIdx.x == 0) ends[row] = static_cast<int32_t>(base);
    return;
  }
  const float* x = logits + base;
  const double mx = x[tokens[row]], temperature = d.temperature;
  const auto weight = [&](int i) { return exp((static_cast<double>(x[i]) - mx) / temperature); };
  if (walks_in_id_order(d, vocab)) {  // the total alone: no bound, so no histogram
    double total = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) total += weight(i);
    total = Reduce(reduce).Sum(total);
    if (threadIdx.x == 0) {
      totals[row] = total;
      ends[row] = static_cast<int32_t>(base);
    }
    return;
  }
  float mn = x[0];
  for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) {
    bucket_mass[b] = 0.0f;
    bucket_count[b] = 0;
  }
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) mn = fminf(mn, x[i]);
  mn = ReduceMin(reduce_min).Reduce(mn, ::cuda::minimum<>{});
  if (threadIdx.x == 0) lowest = mn;
  __syncthreads();
  const double spread = mx - lowest;
  const float scale = spread > 0.0 ? static_cast<float>((kBuckets - 1) / spread) : 0.0f;
  const auto bucket_of = [&](float logit) {
    const float below = static_cast<float>(mx - logit) * scale;
    return below < kBuckets - 1 ? static_cast<int>(below) : kBuckets - 1;
  };
  double total = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const double w = weight(i);
    total += w;
    const int b = bucket_of(x[i]);
    atomicAdd(&bucket_mass[b], static_cast<float>(w));
    atomicAdd(&bucket_count[b], 1);
  }
  total = Reduce(reduce).Sum(total);
  if (threadIdx.x == 0) {
    totals[row] = total;
    // The last bucket kept: the one that completes the top-k, or without top-k the first whose
    // better buckets weigh more than the top-p cut (or the drawn token) can need.
    const int k = kept_top_k(d, vocab);
    const double need = (d.top_p < 1.0f ? d.top_p : d.u) * total * kMassMargin;
    double mass = 0.0;
    int count = 0, b = 0;
    for (; b < kBuckets - 1; ++b) {
      mass += bucket_mass[b];
      count += bucket_count[b];
      if (k > 0 ? count >= k : mass > need) break;
    }
    last_bucket = b;
    kept = 0;
  }
  __syncthreads();
  const int last = last_bucket;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (bucket_of(x[i]) <= last) keys[base + atomicAdd(&kept, 1)] = candidate_key(x[i], i);
  }
  __syncthreads();
  if (threadIdx.x == 0) ends[row] = static_cast<int32_t>(base + kept);
}

// One pass over candidates [0, count) in order: the first i whose running weight (inclusive)
// meets `reached`, or INT_MAX with *total the weight of all of them.
template <typename LogitAt, typename Reached>
__device__ int first_reaching(LogitAt logit_at, int count, double mx, double temperature,
                              Reached reached, double* total) {
  using Scan = cub::BlockScan<double, kDrawThreads>;
  using Reduce = cub::BlockReduce<int, kDrawThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ typename Reduce::TempStorage reduce;
  __shared__ int found;
  double carry = 0.0;
  for (int base = 0; base < count; base += kDrawChunk) {
    const int first = base + threadIdx.x * kDrawItems;
    double w[kDrawItems];
    double local = 0.0;
#pragma unroll
    for (int j = 0; j < kDrawItems; ++j) {
      w[j] = first + j < count ? exp((static_cast<double>(logit_at(first + j)) - mx) / temperature)
                               : 0.0;
      local += w[j];
    }
    double before, chunk;
    Scan(scan).ExclusiveSum(local, before, chunk);
    double running = carry + before;
    int mine = INT_MAX;
#pragma unroll
    for (int j = 0; j < kDrawItems; ++j) {
      running += w[j];
      if (mine == INT_MAX && first + j < count && reached(running)) mine = first + j;
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
template <typename LogitAt>
__device__ double weight_through(LogitAt logit_at, int count, double mx, double temperature) {
  double total = 0.0;
  first_reaching(
      logit_at, count, mx, temperature, [](double) { return false; }, &total);
  return total;
}

// One CTA per row over its kept candidates best first, or over the row in id order.
__global__ void __launch_bounds__(kDrawThreads)
    draw_kernel(const float* logits, const uint64_t* keys, const int32_t* begins,
                const int32_t* ends, const double* totals, int vocab, const TokenDraw* draws,
                int32_t* tokens) {
  follow_prior_grid();
  const int row = blockIdx.x;
  const TokenDraw d = draws[row];
  if (d.temperature <= 0.0f || tokens[row] < 0) return;
  const double temperature = d.temperature;
  if (walks_in_id_order(d, vocab)) {
    const float* x = logits + static_cast<int64_t>(row) * vocab;
    const double target = d.u * totals[row];
    double unused = 0.0;
    const int pick = first_reaching([x](int i) { return x[i]; }, vocab, x[tokens[row]], temperature,
                                    [=](double running) { return running > target; }, &unused);
    if (threadIdx.x == 0) tokens[row] = pick == INT_MAX ? vocab - 1 : pick;
    return;
  }
  const uint64_t* k = keys + begins[row];
  const auto logit_at = [k](int i) { return candidate_logit(k[i]); };
  const int count = ends[row] - begins[row];
  const double mx = candidate_logit(k[0]);
  const int top_k = kept_top_k(d, vocab);
  int keep = top_k > 0 ? min(top_k, count) : count;
  // Without top-k the candidates kept stop where the draw stops; their weight is the row's.
  double mass = top_k > 0 ? weight_through(logit_at, keep, mx, temperature) : totals[row];
  if (d.top_p < 1.0f) {
    const double p = d.top_p, sum = mass;
    double unused = 0.0;
    const int cut = first_reaching(
        logit_at, keep, mx, temperature, [=](double running) { return running / sum >= p; },
        &unused);
    if (cut != INT_MAX) {
      keep = cut + 1;
      mass = weight_through(logit_at, keep, mx, temperature);
    }
  }
  const double target = d.u * mass;
  double unused = 0.0;
  const int pick = first_reaching(
      logit_at, keep, mx, temperature, [=](double running) { return running > target; }, &unused);
  if (threadIdx.x == 0) tokens[row] = candidate_id(k[pick == INT_MAX ? keep - 1 : pick]);
}

struct SortBuffers {
  uint64_t* keys_in;
  uint64_t* keys_out;
  int32_t* begins;
  int32_t* ends;
  double* totals;
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
  b.keys_in = reinterpret_cast<uint64_t*>(take(count * sizeof(uint64_t)));
  b.keys_out = reinterpret_cast<uint64_t*>(take(count * sizeof(uint64_t)));
  b.begins = reinterpret_cast<int32_t*>(take(rows * sizeof(int32_t)));
  b.ends = reinterpret_cast<int32_t*>(take(rows * sizeof(int32_t)));
  b.totals = reinterpret_cast<double*>(take(rows * sizeof(double)));
  EKVA_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeysDescending(
      nullptr, b.temp_bytes, b.keys_in, b.keys_out, static_cast<int64_t>(count), rows, b.begins,
      b.ends));
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

int greedy_chunks(int vocab) {
  return (vocab + kGreedyChunk - 1) / kGreedyChunk;
}

// The greedy workspace: a counter per row, then each row's chunk keys.
size_t greedy_counters_bytes(int rows) {
  return align_up(static_cast<size_t>(rows) * sizeof(int32_t));
}

}  // namespace

size_t greedy_tokens_workspace(int rows, int vocab) {
  if (rows < 0 || rows > 65535 || vocab <= 0) {
    fail(ErrorKind::kUnsupported, "greedy_tokens: {} rows of {} logits (at most 65535 rows)", rows,
         vocab);
  }
  return greedy_counters_bytes(rows) +
         static_cast<size_t>(rows) * greedy_chunks(vocab) * sizeof(uint64_t);
}

void greedy_tokens(const float* logits, int rows, int vocab, void* workspace,
                   size_t workspace_bytes, int32_t* out, cudaStream_t stream) {
  const size_t need = greedy_tokens_workspace(rows, vocab);
  if (rows == 0) return;
  if (workspace == nullptr || workspace_bytes < need) {
    fail(ErrorKind::kInvalidArgument, "greedy_tokens: a workspace of {} bytes, {} needed",
         workspace == nullptr ? 0 : workspace_bytes, need);
  }
  auto* base = static_cast<char*>(workspace);
  launch_overlapping(greedy_kernel, dim3(greedy_chunks(vocab), rows), dim3(kGreedyThreads), 0,
                     stream, logits, vocab,
                     reinterpret_cast<uint64_t*>(base + greedy_counters_bytes(rows)),
                     reinterpret_cast<int*>(base), out);
  EKVA_CUDA_CHECK(cudaGetLastError());
}

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
  launch_overlapping(select_candidates_kernel, dim3(rows), dim3(kSelectThreads), 0, stream, logits,
                     vocab, draws, tokens, b.keys_in, b.begins, b.ends, b.totals);
  EKVA_CUDA_CHECK(cub::DeviceSegmentedSort::SortKeysDescending(
      b.temp, b.temp_bytes, b.keys_in, b.keys_out, static_cast<int64_t>(rows) * vocab, rows,
      b.begins, b.ends, stream));
  launch_overlapping(draw_kernel, dim3(rows), dim3(kDrawThreads), 0, stream, logits, b.keys_out,
                     b.begins, b.ends, b.totals, vocab, draws, tokens);
}

}  // namespace ekva::cuda
