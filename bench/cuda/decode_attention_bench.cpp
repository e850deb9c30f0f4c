// Times the CUDA decode attention and the KV compaction on the H200 (CUDA events around CUDA-graph
// replays, warm-up, medians over repetitions, inputs rotated across replicas so that the 60 MB L2
// never holds a whole working set). Prints a table and writes every measurement as JSON.
//
//   cuda_decode_attention_bench [--out results.json] [--quick]
//   cuda_decode_attention_bench --only B L    (one attention configuration, uniform and ragged)
//   cuda_decode_attention_bench --compaction  (the compaction alone)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_attention.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kv_ops.h"
#include "core/dtype.h"

namespace ekva::cuda {
namespace {

constexpr int kNumQHeads = 32;  // Mixtral attention: 32 query heads, 8 KV heads, head_dim 128
constexpr int kNumKvHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kPageSize = 16;
constexpr size_t kRotationBytes = size_t{1} << 30;  // >= 16x the L2 per timed round

// Random bf16 in [-1, 1): a 64 MB host block, tiled over the device array. Timing depends on
// addresses, not on whether content repeats.
void fill_random(uint16_t* data, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> block(std::min(count, size_t{32} << 20));
  for (uint16_t& x : block) x = f32_to_bf16(u(rng));
  for (size_t done = 0; done < count; done += block.size()) {
    const size_t n = std::min(block.size(), count - done);
    EKVA_CUDA_CHECK(
        cudaMemcpy(data + done, block.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median per-call milliseconds of `body(i)` over `reps` replays of a graph of `calls` calls.
template <typename Body>
double time_graph(cudaStream_t stream, int calls, int reps, Body body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  EKVA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) body(i);
  EKVA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  EKVA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  EKVA_CUDA_CHECK(cudaEventCreate(&start));
  EKVA_CUDA_CHECK(cudaEventCreate(&stop));
  EKVA_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  EKVA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> per_call;
  for (int r = 0; r < reps; ++r) {
    EKVA_CUDA_CHECK(cudaEventRecord(start, stream));
    EKVA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    EKVA_CUDA_CHECK(cudaEventRecord(stop, stream));
    EKVA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    EKVA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_call.push_back(ms / calls);
  }
  EKVA_CUDA_CHECK(cudaEventDestroy(start));
  EKVA_CUDA_CHECK(cudaEventDestroy(stop));
  EKVA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  EKVA_CUDA_CHECK(cudaGraphDestroy(graph));
  return median(per_call);
}

struct Pool {
  DeviceBuffer<uint16_t> data;
  int64_t pages = 0;
};

// Block tables for `replicas` disjoint copies of the same lengths, pages shuffled over the pool.
struct Tables {
  std::vector<DeviceBuffer<int32_t>> page_ids, page_offsets, lengths;
};

Tables make_tables(const std::vector<int32_t>& lengths, int replicas, int64_t pool_pages,
                   std::mt19937& rng) {
  std::vector<int32_t> offsets = {0};
  for (int32_t l : lengths) offsets.push_back(offsets.back() + (l + kPageSize - 1) / kPageSize);
  const int64_t pages = offsets.back();
  std::vector<int32_t> all(pool_pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  Tables t;
  for (int r = 0; r < replicas; ++r) {
    std::vector<int32_t> ids(all.begin() + r * pages, all.begin() + (r + 1) * pages);
    if (ids.empty()) ids.push_back(0);
    t.page_ids.emplace_back(std::span<const int32_t>(ids));
    t.page_offsets.emplace_back(std::span<const int32_t>(offsets));
    t.lengths.emplace_back(std::span<const int32_t>(lengths));
  }
  return t;
}

PagedKvLayer layer_view(Pool& pool, Tables& t, int r, int batch) {
  PagedKvLayer kv;
  kv.pool = pool.data.data();
  kv.page_ids = t.page_ids[r].data();
  kv.page_offsets = t.page_offsets[r].data();
  kv.lengths = t.lengths[r].data();
  kv.num_sequences = batch;
  kv.num_kv_heads = kNumKvHeads;
  kv.head_dim = kHeadDim;
  kv.page_size = kPageSize;
  return kv;
}

struct AttentionResult {
  double ms = 0;
  double bytes = 0;
};

AttentionResult time_attention(Pool& pool, int batch, const std::vector<int32_t>& lengths,
                               bool with_scores, std::mt19937& rng, cudaStream_t stream) {
  const double kv_bytes =
      std::accumulate(lengths.begin(), lengths.end(), 0.0) * 2 * kHeadDim * sizeof(uint16_t);
  int64_t pages_needed = 0;
  for (int32_t l : lengths) pages_needed += (l + kPageSize - 1) / kPageSize;
  const int replicas = static_cast<int>(
      std::clamp<int64_t>(std::min<int64_t>(static_cast<int64_t>(kRotationBytes / kv_bytes) + 1,
                                            pool.pages / std::max<int64_t>(pages_needed, 1)),
                          1, 16));
  Tables tables = make_tables(lengths, replicas, pool.pages, rng);
  const DecodeAttentionShape shape{batch,    kNumQHeads, kNumKvHeads,
                                   kHeadDim, kPageSize,  with_scores};
  const DecodeAttentionPlan plan(shape, lengths);
  std::printf("  (B=%d: %d CTAs, %d pieces, %d rotated replicas)\n", batch, plan.num_ctas(),
              plan.num_pieces(), replicas);
  DeviceBuffer<uint8_t> schedule(plan.schedule_bytes()), scratch(plan.scratch_bytes());
  plan.upload(schedule.data(), scratch.data(), stream);
  const size_t q_elems = static_cast<size_t>(batch) * kNumQHeads * kHeadDim;
  DeviceBuffer<uint16_t> q(q_elems * replicas), out(q_elems);
  fill_random(q.data(), q.size(), 99);
  DeviceBuffer<float> scores(with_scores ? static_cast<size_t>(pool.pages) * kPageSize : 0);
  std::vector<PagedKvLayer> views;
  for (int r = 0; r < replicas; ++r) views.push_back(layer_view(pool, tables, r, batch));
  const int calls = std::max(replicas, std::clamp(static_cast<int>(2e9 / kv_bytes), 2, 64));
  const double ms = time_graph(stream, calls, 9, [&](int i) {
    const int r = i % replicas;
    plan.run(views[r], q.data() + r * q_elems, out.data(), with_scores ? scores.data() : nullptr,
             schedule.data(), scratch.data(), stream);
  });
  return {ms, kv_bytes};
}

// Device-to-device copy, read + write bytes, eager (a graph's memcpy node can take the slower
// copy engine).
double copy_bandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{4} << 30;
  DeviceBuffer<uint8_t> a(bytes), b(bytes);
  EKVA_CUDA_CHECK(cudaMemsetAsync(a.data(), 1, bytes, stream));
  cudaEvent_t start, stop;
  EKVA_CUDA_CHECK(cudaEventCreate(&start));
  EKVA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < 8; ++r) {
    EKVA_CUDA_CHECK(cudaEventRecord(start, stream));
    EKVA_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    EKVA_CUDA_CHECK(cudaEventRecord(stop, stream));
    EKVA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    EKVA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) times.push_back(ms);
  }
  EKVA_CUDA_CHECK(cudaEventDestroy(start));
  EKVA_CUDA_CHECK(cudaEventDestroy(stop));
  return 2.0 * bytes / (median(times) * 1e-3);
}

struct CompactionResult {
  double ms = 0;
  double moved_bytes = 0;  // read + written
};

CompactionResult time_compaction(Pool& pool, int batch, int length, double evict_fraction,
                                 std::mt19937& rng, cudaStream_t stream) {
  const std::vector<int32_t> lengths(static_cast<size_t>(batch) * kNumKvHeads, length);
  Tables tables = make_tables(lengths, 1, pool.pages, rng);
  PagedKvLayer kv = layer_view(pool, tables, 0, batch);
  const int64_t rows = pool.pages * kPageSize;
  std::vector<uint8_t> flags(rows, 0);
  const std::vector<int32_t> ids = tables.page_ids[0].download();
  std::bernoulli_distribution evict(evict_fraction);
  int64_t moves = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    std::vector<uint8_t> f(length);
    for (auto& x : f) x = evict(rng);
    const int kept = length - static_cast<int>(std::count(f.begin(), f.end(), 1));
    for (int i = 0; i < length; ++i) {
      flags[static_cast<size_t>(ids[s * (length / kPageSize) + i / kPageSize]) * kPageSize +
            i % kPageSize] = f[i];
      moves += i < kept && f[i];
    }
  }
  DeviceBuffer<uint8_t> flags_d{std::span<const uint8_t>(flags)};
  DeviceBuffer<uint8_t> workspace(compaction_workspace_bytes(rows, kv.num_segments()));
  cudaEvent_t start, stop;
  EKVA_CUDA_CHECK(cudaEventCreate(&start));
  EKVA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r < 8; ++r) {
    // Every repetition starts from the full lengths: the same moves each time.
    EKVA_CUDA_CHECK(cudaMemcpyAsync(kv.lengths, lengths.data(), lengths.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream));
    EKVA_CUDA_CHECK(cudaEventRecord(start, stream));
    evict_flagged(kv, flags_d.data(), rows, workspace.data(), stream);
    EKVA_CUDA_CHECK(cudaEventRecord(stop, stream));
    EKVA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    EKVA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) times.push_back(ms);  // the first is warm-up
  }
  EKVA_CUDA_CHECK(cudaEventDestroy(start));
  EKVA_CUDA_CHECK(cudaEventDestroy(stop));
  return {median(times), static_cast<double>(moves) * 2 * 2 * kHeadDim * sizeof(uint16_t)};
}

// Lengths spread 10x (uniform in [m, 10m]) with exactly the uniform case's total.
std::vector<int32_t> ragged_lengths(int segments, int length, std::mt19937& rng) {
  const double low = length / 5.5;
  std::uniform_real_distribution<double> u(low, 10 * low);
  std::vector<int32_t> l(segments);
  int64_t total = 0;
  for (int32_t& x : l) total += x = static_cast<int32_t>(u(rng));
  const int64_t want = static_cast<int64_t>(segments) * length;
  // Spread the rounding difference over all segments, keeping each positive.
  for (size_t i = 0; total != want; i = (i + 1) % l.size()) {
    const int step = total < want ? 1 : -1;
    if (l[i] + step > 0) {
      l[i] += step;
      total += step;
    }
  }
  return l;
}

int run(int argc, char** argv) {
  std::string out_path = "decode_attention_bench.json";
  bool quick = false;
  bool only = false;  // --only B L: one attention configuration (for profilers), nothing else
  int only_batch = 0;
  int only_context = 0;
  bool compaction_only = false;  // --compaction: the compaction at B = 32, L = 16k, nothing else
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--compaction") == 0) compaction_only = true;
    if (std::strcmp(argv[i], "--only") == 0) {
      only = true;
      if (i + 2 < argc) {
        only_batch = std::atoi(argv[++i]);
        only_context = std::atoi(argv[++i]);
      }
    }
  }
  if (only && (only_batch < 1 || only_context < 1)) {
    std::fprintf(stderr, "error: --only needs a batch and a context of at least 1 (got %d %d)\n",
                 only_batch, only_context);
    return 2;
  }
  cudaStream_t stream;
  EKVA_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  EKVA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  if (only || compaction_only) {
    // One configuration (for profilers and quick comparisons): a pool big enough for it and for
    // as many rotated replicas as the full run uses, so that times compare (with one replica,
    // lines left in L2 by the call before made B = 1, L = 16k look 0.4-0.8 us faster).
    const int batch = only ? only_batch : 32;
    const int context = only ? only_context : 16384;
    const int64_t pages = static_cast<int64_t>(batch) * context * kNumKvHeads / kPageSize;
    const double kv_bytes =
        static_cast<double>(pages) * kPageSize * 2 * kHeadDim * sizeof(uint16_t);
    Pool pool;
    pool.pages =
        pages * std::clamp<int64_t>(static_cast<int64_t>(kRotationBytes / kv_bytes) + 1, 1, 16) +
        4096;
    pool.data = DeviceBuffer<uint16_t>(static_cast<size_t>(pool.pages) * 2 * kPageSize * kHeadDim);
    fill_random(pool.data.data(), pool.data.size(), 1234);
    std::mt19937 rng(42);
    if (compaction_only) {
      const double copy_bw = copy_bandwidth(stream);
      const CompactionResult c = time_compaction(pool, batch, context, 0.5, rng, stream);
      const CompactionResult scan = time_compaction(pool, batch, context, 0.0, rng, stream);
      const double bw = c.moved_bytes / (c.ms * 1e-3);
      std::printf(
          "compaction B=%d L=%d evict 50%%: %.1f us (scan only %.1f us), %.3f TB/s = %.0f%% of "
          "copy %.3f TB/s\n",
          batch, context, c.ms * 1e3, scan.ms * 1e3, bw / 1e12, 100 * bw / copy_bw, copy_bw / 1e12);
      return 0;
    }
    const std::vector<int32_t> uniform(static_cast<size_t>(batch) * kNumKvHeads, context);
    const AttentionResult u = time_attention(pool, batch, uniform, false, rng, stream);
    const AttentionResult r = time_attention(
        pool, batch, ragged_lengths(batch * kNumKvHeads, context, rng), false, rng, stream);
    std::printf("B=%d L=%d: %.2f us, %.3f TB/s; ragged %.2f us (%.3f)\n", batch, context,
                u.ms * 1e3, u.bytes / (u.ms * 1e-3) / 1e12, r.ms * 1e3, r.ms / u.ms);
    return 0;
  }
  const double copy_bw = copy_bandwidth(stream);
  // Big enough for the largest configuration (B = 64, L = 128k: 34 GB of K/V).
  const std::vector<int> batches = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32, 64};
  const std::vector<int> contexts =
      quick ? std::vector<int>{4096, 16384} : std::vector<int>{4096, 16384, 65536, 131072};
  const int64_t max_tokens = static_cast<int64_t>(batches.back()) * contexts.back() * kNumKvHeads;
  Pool pool;
  pool.pages = max_tokens / kPageSize + 4096;
  pool.data = DeviceBuffer<uint16_t>(static_cast<size_t>(pool.pages) * 2 * kPageSize * kHeadDim);
  fill_random(pool.data.data(), pool.data.size(), 1234);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());

  std::mt19937 rng(42);
  std::string json = "{\n  \"device\": \"" + std::string(prop.name) + "\",\n";
  json += "  \"copy_bandwidth_bytes_per_s\": " + std::to_string(copy_bw) + ",\n";
  json +=
      "  \"shape\": {\"num_q_heads\": 32, \"num_kv_heads\": 8, \"head_dim\": 128, \"page_size\": "
      "16},\n";
  json += "  \"attention\": [\n";
  std::printf("device %s, copy %.2f TB/s (read + write)\n", prop.name, copy_bw / 1e12);
  std::printf("%4s %7s %12s %9s %12s %9s %7s\n", "B", "L", "uniform_us", "TB/s", "ragged_us",
              "TB/s", "r/u");
  bool first = true;
  for (int b : batches) {
    for (int l : contexts) {
      const std::vector<int32_t> uniform(static_cast<size_t>(b) * kNumKvHeads, l);
      const AttentionResult u = time_attention(pool, b, uniform, false, rng, stream);
      const AttentionResult r =
          time_attention(pool, b, ragged_lengths(b * kNumKvHeads, l, rng), false, rng, stream);
      const double u_bw = u.bytes / (u.ms * 1e-3), r_bw = r.bytes / (r.ms * 1e-3);
      std::printf("%4d %7d %12.2f %9.3f %12.2f %9.3f %7.3f\n", b, l, u.ms * 1e3, u_bw / 1e12,
                  r.ms * 1e3, r_bw / 1e12, r.ms / u.ms);
      json += std::string(first ? "" : ",\n") + "    {\"batch\": " + std::to_string(b) +
              ", \"context\": " + std::to_string(l) + ", \"kv_bytes\": " + std::to_string(u.bytes) +
              ", \"uniform_us\": " + std::to_string(u.ms * 1e3) +
              ", \"ragged_us\": " + std::to_string(r.ms * 1e3) + "}";
      first = false;
    }
  }
  json += "\n  ],\n";

  // The fused per-slot score: its cost at one mid-size point.
  {
    const int b = quick ? 8 : 32, l = 16384;
    const std::vector<int32_t> uniform(static_cast<size_t>(b) * kNumKvHeads, l);
    const AttentionResult plain = time_attention(pool, b, uniform, false, rng, stream);
    const AttentionResult fused = time_attention(pool, b, uniform, true, rng, stream);
    std::printf("scores fused, B=%d L=%d: %.2f us vs %.2f us without\n", b, l, fused.ms * 1e3,
                plain.ms * 1e3);
    json += "  \"scores\": {\"batch\": " + std::to_string(b) +
            ", \"context\": " + std::to_string(l) +
            ", \"plain_us\": " + std::to_string(plain.ms * 1e3) +
            ", \"with_scores_us\": " + std::to_string(fused.ms * 1e3) + "},\n";
  }

  {
    const int b = quick ? 8 : 32, l = 16384;
    const CompactionResult c = time_compaction(pool, b, l, 0.5, rng, stream);
    const double bw = c.moved_bytes / (c.ms * 1e-3);
    std::printf("compaction B=%d L=%d evict 50%%: %.1f us, %.3f TB/s moved = %.0f%% of copy\n", b,
                l, c.ms * 1e3, bw / 1e12, 100 * bw / copy_bw);
    // The same pass with nothing flagged: what scanning the flags and tables costs alone.
    const CompactionResult scan = time_compaction(pool, b, l, 0.0, rng, stream);
    std::printf("compaction with nothing flagged (scan only): %.1f us\n", scan.ms * 1e3);
    json += "  \"compaction\": {\"batch\": " + std::to_string(b) +
            ", \"context\": " + std::to_string(l) +
            ", \"evict_fraction\": 0.5, \"us\": " + std::to_string(c.ms * 1e3) +
            ", \"moved_bytes\": " + std::to_string(c.moved_bytes) +
            ", \"scan_only_us\": " + std::to_string(scan.ms * 1e3) + "}\n}\n";
  }
  std::ofstream(out_path) << json;
  EKVA_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace ekva::cuda

int main(int argc, char** argv) {
  try {
    return ekva::cuda::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
