// The ceilings of the machine this runs on, for data/hardware/*.json "measured" profiles:
// streaming read and copy bandwidth over buffers far larger than the caches, and the float32 GEMM
// rate of the BLAS the CPU backend uses. Figures and commands go to docs/BENCHMARKS.md.
// Rates are over the main thread's CPU time, not wall time: on a shared machine (other builds
// running) that approximates what the threads achieve while they run; every thread does an equal
// static share of the work.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <cstddef>
#include <vector>

namespace {

constexpr size_t kStreamBytes = size_t{512} << 20;  // well past any last-level cache
constexpr size_t kStreamFloats = kStreamBytes / sizeof(float);

std::vector<float>& source_buffer() {
  static std::vector<float> buffer = [] {
    std::vector<float> b(kStreamFloats);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i & 1023);
    return b;
  }();
  return buffer;
}

void BM_StreamRead(benchmark::State& state) {
  const std::vector<float>& src = source_buffer();
  for (auto _ : state) {
    float sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < src.size(); ++i) sum += src[i];
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kStreamBytes));
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_StreamRead)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Counted as read + write (2 bytes moved per byte copied), as the GPU copy figures are.
void BM_StreamCopy(benchmark::State& state) {
  const std::vector<float>& src = source_buffer();
  std::vector<float> dst(kStreamFloats);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < dst.size(); ++i) dst[i] = 0;
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < src.size(); ++i) dst[i] = src[i];
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * kStreamBytes));
  state.counters["threads"] = omp_get_max_threads();
}
BENCHMARK(BM_StreamCopy)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Sgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Sgemm)->Arg(1024)->Arg(2048)->Arg(4096)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
