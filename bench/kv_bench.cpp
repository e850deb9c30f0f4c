// KV-policy overhead at decode: attention over one sequence's retained KV (Mixtral attention shape:
// 32 query heads, 8 KV heads, head_dim 128, 16k-token context) with and without the score
// bookkeeping and eviction that a policy adds per step; the pool's bytes per retained token; and
// the compression of a long prompt on the host; and a prompt's and a decode step's plans on the
// host.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "kv/eviction_plan.h"
#include "kv/policy.h"

namespace ekva {
namespace {

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kContext = 16384;

ModelSpec attention_shape() {
  ModelSpec s;
  s.model_type = "mixtral";
  s.num_layers = 1;
  s.num_heads = kQHeads;
  s.num_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  s.num_experts = 8;
  s.top_k = 2;
  s.max_position = 1 << 16;
  return s;
}

// The host KV cache: the layout and its pages, as the CPU backend holds them.
struct HostCache {
  explicit HostCache(const ModelSpec& spec) : layout(spec, 1), pages(layout) {}
  void append(int h, const float* k, const float* v, TokenMeta m) {
    const int slot = layout.append(0, 0, h, m);
    pages.reserve(layout);
    pages.write(layout.address(layout.table(0, 0, h), slot), k, v);
  }
  KvLayout layout;
  KvPages pages;
};

void fill(HostCache& cache, int tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> k(kHeadDim), v(kHeadDim);
  for (int p = 0; p < tokens; ++p) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (auto& x : k) x = normal(rng);
      for (auto& x : v) x = normal(rng);
      TokenMeta m;
      m.position = p;
      m.expert = static_cast<int16_t>(rng() % 8);
      m.score = std::abs(normal(rng));
      cache.append(h, k.data(), v.data(), m);
    }
  }
  cache.layout.advance(0, tokens);
}

// One decode step: append a token per KV head, attend (optionally scoring), optionally evict.
void BM_DecodeStep(benchmark::State& state) {
  const std::string policy_name = state.range(0) == 0   ? "full"
                                  : state.range(0) == 1 ? "h2o"
                                                        : "ekva";
  const bool bookkeeping = state.range(0) != 0;
  const ModelSpec spec = attention_shape();
  std::mt19937 rng(3);
  HostCache cache(spec);
  fill(cache, kContext, rng);
  PolicyOptions o;
  o.name = policy_name;
  o.budget = 0.25;
  KvPolicy policy(o, spec);
  apply_on_host(policy.compress(cache.layout, 0, kContext), cache.layout,
                cache.pages);  // full keeps 16k; the others keep 4k per KV head
  std::vector<float> q(kQHeads * kHeadDim), out(q.size()), k(kHeadDim, 0.1f), v(kHeadDim, 0.1f);
  std::normal_distribution<float> normal;
  for (auto& x : q) x = normal(rng);
  double attention_s = 0, bookkeeping_s = 0;
  for (auto _ : state) {
    const int32_t seq = 0, pos = cache.layout.next_position(0);
    for (int h = 0; h < kKvHeads; ++h) {
      TokenMeta m;
      m.position = pos;
      m.expert = static_cast<int16_t>(pos % 8);
      cache.append(h, k.data(), v.data(), m);
    }
    cache.layout.advance(0, 1);
    const uint8_t score = bookkeeping ? 1 : 0;
    auto t0 = std::chrono::steady_clock::now();
    cpu::attention(cache.layout, cache.pages, 0, q.data(), &seq, &pos, 1, kQHeads, out.data(),
                   &score);
    auto t1 = std::chrono::steady_clock::now();
    apply_on_host(policy.evict(cache.layout, 0), cache.layout, cache.pages);
    auto t2 = std::chrono::steady_clock::now();
    attention_s += std::chrono::duration<double>(t1 - t0).count();
    bookkeeping_s += std::chrono::duration<double>(t2 - t1).count();
    if (!bookkeeping) {  // full: keep the table at 16k so every step measures the same work
      for (int h = 0; h < kKvHeads; ++h) {
        std::vector<uint8_t> last(cache.layout.table(0, 0, h).size(), 0);
        last.back() = 1;
        cache.pages.move_rows(cache.layout.evict_flagged(0, 0, h, last));
      }
    }
  }
  state.counters["retained_per_head"] = cache.layout.table(0, 0, 0).size();
  state.counters["attention_us"] = 1e6 * attention_s / state.iterations();
  state.counters["evict_us"] = 1e6 * bookkeeping_s / state.iterations();
}

// Attention alone over the same retained tokens without scoring, the baseline for the overhead
// ratio.
void BM_AttentionOnly(benchmark::State& state) {
  const ModelSpec spec = attention_shape();
  std::mt19937 rng(3);
  HostCache cache(spec);
  fill(cache, static_cast<int>(state.range(0)), rng);
  std::vector<float> q(kQHeads * kHeadDim), out(q.size());
  std::normal_distribution<float> normal;
  for (auto& x : q) x = normal(rng);
  const int32_t seq = 0, pos = cache.layout.next_position(0);
  const uint8_t score = static_cast<uint8_t>(state.range(1));
  for (auto _ : state) {
    cpu::attention(cache.layout, cache.pages, 0, q.data(), &seq, &pos, 1, kQHeads, out.data(),
                   &score);
  }
}

void BM_BytesPerRetainedToken(benchmark::State& state) {
  const ModelSpec spec = attention_shape();
  const int budget = static_cast<int>(state.range(0));
  std::mt19937 rng(5);
  HostCache cache(spec);
  fill(cache, kContext, rng);
  PolicyOptions o;
  o.name = "ekva";
  o.budget = budget;
  KvPolicy policy(o, spec);
  for (auto _ : state) benchmark::DoNotOptimize(cache.layout.kv_bytes_in_use());
  apply_on_host(policy.compress(cache.layout, 0, kContext), cache.layout, cache.pages);
  const double ideal = 2.0 * kHeadDim * sizeof(float);
  state.counters["kv_bytes_per_token_vs_ideal"] =
      cache.layout.kv_bytes_in_use() / (ideal * cache.layout.retained_tokens());
  state.counters["with_metadata_vs_ideal"] =
      (cache.layout.kv_bytes_in_use() + cache.layout.metadata_bytes_in_use()) /
      (ideal * cache.layout.retained_tokens());
}

// A prompt's compression on the host, as every backend makes it after the prefill (a device backend
// too): the policy's budgets and selection, then the layout's compaction, for 4 layers x 8 KV heads
// of a 32k-token prompt (an eighth of Mixtral-8x7B's tables) with random scores, at 20%.
void BM_CompressPrompt(benchmark::State& state) {
  static const char* const kPolicies[] = {"streaming", "snapkv", "adakv", "h2o"};
  ModelSpec spec = attention_shape();
  spec.num_layers = 4;
  constexpr int kPrompt = 32768;
  KvLayout filled(spec, 1);
  std::mt19937 rng(3);
  std::exponential_distribution<float> score;
  for (int p = 0; p < kPrompt; ++p) {
    for (int l = 0; l < spec.num_layers; ++l) {
      for (int h = 0; h < kKvHeads; ++h) {
        TokenMeta m;
        m.position = p;
        m.score = score(rng);
        filled.append(0, l, h, m);
      }
    }
  }
  filled.advance(0, kPrompt);
  PolicyOptions options;
  options.name = kPolicies[state.range(0)];
  options.budget = 0.2;
  for (auto _ : state) {
    state.PauseTiming();
    KvLayout layout = filled;
    KvPolicy policy(options, spec);
    state.ResumeTiming();
    const EvictionPlan plan = policy.compress(layout, 0, kPrompt);
    const std::vector<std::vector<uint8_t>> flags = select_plan_evictions(plan, layout);
    for (size_t i = 0; i < plan.segments.size(); ++i)
      layout.evict_flagged(0, plan.segments[i].layer, plan.segments[i].kv_head, flags[i]);
    benchmark::DoNotOptimize(layout.retained_tokens());
  }
  state.SetLabel(options.name);
}

// The tables of a model with the benchmark's arguments' layers and KV heads.
ModelSpec tables_shape(const benchmark::State& state) {
  ModelSpec s = attention_shape();
  s.num_layers = static_cast<int>(state.range(0));
  s.num_kv_heads = static_cast<int>(state.range(1));
  s.num_heads = 2 * s.num_kv_heads;
  s.vocab_size = 32000;
  return s;
}

// One sequence's first `tokens` tokens.
ForwardBatch prompt_batch(const ModelSpec& s, int tokens) {
  ForwardBatch batch;
  for (int t = 0; t < tokens; ++t) batch.add(t % s.vocab_size, 0, t);
  return batch;
}

// A prompt's step plan on the host (plan_step: a slot for every layer, token and KV head), which
// every backend makes before the step's first kernel: 4096 tokens on one sequence's empty tables,
// with Qwen3-30B-A3B's tables (48 layers x 4 KV heads) and OLMoE-1B-7B's (16 x 16).
void BM_PlanPrompt(benchmark::State& state) {
  constexpr int kPrompt = 4096;
  const ModelSpec s = tables_shape(state);
  KvLayout layout(s, 1, KvFormat{16, DType::kBF16});
  ForwardBatch batch = prompt_batch(s, kPrompt);
  batch.logit_rows = {kPrompt - 1};
  for (auto _ : state) {
    state.PauseTiming();
    layout.clear_sequence(0);
    state.ResumeTiming();
    const StepPlan plan = plan_step(s, batch, layout);
    benchmark::DoNotOptimize(plan.slots.data());
  }
}

// A batch-1 decode step's plan on the host (plan_step: one slot in every (layer, KV head) table),
// which every backend makes before the step's first kernel, with Qwen3-30B-A3B's tables (48 x 4),
// OLMoE-1B-7B's (16 x 16) and Mixtral-8x7B's (32 x 8), from a context of 4200 tokens: past 4096,
// so that no table's metadata outgrows its capacity within the 3900 steps (that copy of every
// table comes once a doubling), though its first touches of the new capacity count.
void BM_PlanDecodeStep(benchmark::State& state) {
  constexpr int kFilled = 4200;
  const ModelSpec s = tables_shape(state);
  KvLayout layout(s, 1, KvFormat{16, DType::kBF16});
  plan_step(s, prompt_batch(s, kFilled), layout);
  for (auto _ : state) {
    ForwardBatch batch;
    batch.add(1, 0, layout.next_position(0));
    const StepPlan plan = plan_step(s, batch, layout);
    benchmark::DoNotOptimize(plan.slots.data());
  }
}

}  // namespace
}  // namespace ekva

// Arg: 0 = full (no bookkeeping, 16k retained), 1 = h2o, 2 = ekva, 3 = ekva-online (4k retained per
// KV head).
BENCHMARK(ekva::BM_DecodeStep)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK(ekva::BM_AttentionOnly)
    ->Args({4097, 0})
    ->Args({4097, 1})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(2.0);
BENCHMARK(ekva::BM_BytesPerRetainedToken)->Arg(256)->Arg(1000)->Arg(4096)->Iterations(1);
BENCHMARK(ekva::BM_CompressPrompt)->DenseRange(0, 3)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(ekva::BM_PlanPrompt)
    ->Args({48, 4})
    ->Args({16, 16})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
BENCHMARK(ekva::BM_PlanDecodeStep)
    ->Args({48, 4})
    ->Args({16, 16})
    ->Args({32, 8})
    ->Iterations(3900)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
