// CPU engine throughput on a synthetic Mixtral-shaped model (hidden 1024, 16 query / 4 KV heads,
// 8 experts top-2 of width 3584, 8 layers, vocab 32000, bf16 weights), and decode's achieved weight
// bandwidth as a fraction of a copy bandwidth measured in the same run with the same threads.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "io/safetensors.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

constexpr int kHidden = 1024, kLayers = 8, kHeads = 16, kKvHeads = 4, kExperts = 8, kInter = 3584,
              kVocab = 32000;

fs::path synthetic_model() {
  const fs::path dir = fs::temp_directory_path() / "ekva_bench_mixtral_h1024";
  if (fs::exists(dir / "model.safetensors")) return dir;
  fs::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 3584,
    "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4, "num_local_experts": 8,
    "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "eos_token_id": 2})";
  std::vector<std::vector<uint16_t>> storage;
  std::vector<TensorToWrite> tensors;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<uint16_t> v(n);
    const float scale = norm ? 0.0f : 1.0f / std::sqrt(static_cast<float>(shape.back()));
    for (auto& e : v) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      const float u = static_cast<float>(state >> 40) / static_cast<float>(1ull << 24) - 0.5f;
      e = f32_to_bf16(norm ? 1.0f : 2.0f * u * scale);
    }
    storage.push_back(std::move(v));
    tensors.push_back({name, DType::kBF16, std::move(shape), storage.back().data()});
  };
  add("model.embed_tokens.weight", {kVocab, kHidden}, false);
  add("lm_head.weight", {kVocab, kHidden}, false);
  add("model.norm.weight", {kHidden}, true);
  const int kv = kKvHeads * kHidden / kHeads;
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {kHidden}, true);
    add(p + "post_attention_layernorm.weight", {kHidden}, true);
    add(p + "self_attn.q_proj.weight", {kHidden, kHidden}, false);
    add(p + "self_attn.k_proj.weight", {kv, kHidden}, false);
    add(p + "self_attn.v_proj.weight", {kv, kHidden}, false);
    add(p + "self_attn.o_proj.weight", {kHidden, kHidden}, false);
    add(p + "block_sparse_moe.gate.weight", {kExperts, kHidden}, false);
    for (int e = 0; e < kExperts; ++e) {
      const std::string ep = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      add(ep + "w1.weight", {kInter, kHidden}, false);
      add(ep + "w3.weight", {kInter, kHidden}, false);
      add(ep + "w2.weight", {kHidden, kInter}, false);
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

const Model& model() {
  static const std::unique_ptr<Model> m = Model::load(synthetic_model());
  return *m;
}

double g_copy_bytes_per_s = 0.0;

// Read + write bytes per second of a parallel memcpy over buffers far larger than the caches.
void BM_Copy(benchmark::State& state) {
  const size_t bytes = size_t{1} << 30;
  std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const size_t chunk = bytes / omp_get_num_threads();
      const size_t off = chunk * omp_get_thread_num();
      std::memcpy(dst.get() + off, src.get() + off, chunk);
    }
    benchmark::ClobberMemory();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  g_copy_bytes_per_s = 2.0 * static_cast<double>(bytes) * state.iterations() / seconds;
  state.counters["GB_per_s"] = g_copy_bytes_per_s / 1e9;
  state.counters["threads"] = omp_get_max_threads();
}

void BM_Decode(benchmark::State& state) {
  const Model& m = model();
  const int context = static_cast<int>(state.range(0));
  Engine engine(m);
  ForwardBatch prompt;
  for (int t = 0; t < context; ++t) prompt.add(1 + t % 1000, 0, t);
  prompt.logit_rows = {context - 1};
  engine.step(prompt);
  int32_t token = 7;
  double seconds = 0.0;
  for (auto _ : state) {
    ForwardBatch step;
    step.add(token, 0, engine.layout().next_position(0));
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<float> logits = engine.step(step);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    state.PauseTiming();
    if (engine.layout().next_position(0) + 1 >= m.spec().max_position) {  // stay in the context
      engine.clear(0);
      engine.step(prompt);
    }
    state.ResumeTiming();
  }
  const double bytes = static_cast<double>(m.active_weight_bytes_per_token());
  const double weight_bytes_per_s = bytes * state.iterations() / seconds;
  state.counters["tokens_per_s"] = state.iterations() / seconds;
  state.counters["active_weight_MB"] = bytes / 1e6;
  state.counters["weight_GB_per_s"] = weight_bytes_per_s / 1e9;
  // Requires BM_Copy to have run first in this process (registration order).
  state.counters["fraction_of_copy"] =
      g_copy_bytes_per_s > 0 ? weight_bytes_per_s / g_copy_bytes_per_s : 0.0;
}

void BM_Prefill(benchmark::State& state) {
  const Model& m = model();
  const int tokens = static_cast<int>(state.range(0));
  ForwardBatch prompt;
  for (int t = 0; t < tokens; ++t) prompt.add(1 + t % 1000, 0, t);
  prompt.logit_rows = {tokens - 1};
  for (auto _ : state) {
    benchmark::DoNotOptimize(Engine(m).step(prompt));
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(tokens) * state.iterations(), benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace ekva

BENCHMARK(ekva::BM_Copy)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(ekva::BM_Decode)
    ->Arg(128)
    ->Arg(1024)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(3.0);
BENCHMARK(ekva::BM_Prefill)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
BENCHMARK_MAIN();
