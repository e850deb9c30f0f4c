// The calibration statistics pass against a plain forward over the same chunks, side by side in one
// run (goal: <= 1.5x). Model: the embedded default model when present, else tiny-mixtral.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "budget/calibration.h"
#include "engine/engine.h"

namespace ekva {
namespace {

const Model& model() {
  static const std::unique_ptr<Model> m = [] {
    const std::filesystem::path root = std::filesystem::path(EKVA_DATA_DIR).parent_path();
    const auto embedded = root / "models" / "ekva-moe-8m";
    return Model::load(std::filesystem::exists(embedded / "model.safetensors")
                           ? embedded
                           : root / "tests/fixtures/hf-tiny/tiny-mixtral");
  }();
  return *m;
}

std::vector<std::vector<int32_t>> chunks(int count, int length) {
  std::vector<std::vector<int32_t>> c(count, std::vector<int32_t>(length));
  const int vocab = model().spec().vocab_size;
  for (int i = 0; i < count; ++i)
    for (int t = 0; t < length; ++t) c[i][t] = (t * 131 + i * 17 + (t * t) % 97) % vocab;
  return c;
}

void BM_PlainForward(benchmark::State& state) {
  const auto data = chunks(2, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    for (const auto& chunk : data) {
      ForwardBatch b;
      for (size_t i = 0; i < chunk.size(); ++i) b.add(chunk[i], 0, static_cast<int32_t>(i));
      benchmark::DoNotOptimize(Engine(model()).step(b));
    }
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(2.0 * state.range(0) * state.iterations(), benchmark::Counter::kIsRate);
}

void BM_CalibrationStats(benchmark::State& state) {
  const auto data = chunks(2, static_cast<int>(state.range(0)));
  CalibrationOptions o;
  o.chunk_tokens = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(calibrate(model(), data, o));
  state.counters["tokens_per_s"] =
      benchmark::Counter(2.0 * state.range(0) * state.iterations(), benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace ekva

BENCHMARK(ekva::BM_PlainForward)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
BENCHMARK(ekva::BM_CalibrationStats)
    ->Arg(512)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
BENCHMARK_MAIN();
