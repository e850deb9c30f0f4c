// `ekva bench`: end-to-end prefill and decode steps on the GPU for a model directory or a
// config.json with seeded random weights, each measurement beside the project's Roofline
// prediction for the same configuration.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "cli/commands.h"
#include "cli/model_args.h"
#include "core/error.h"
#include "roofline/cost_model.h"
#include "roofline/hardware.h"
#ifdef EKVA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#endif

namespace ekva::cli {
namespace {

struct BenchArgs {
  ModelArgs model;
  std::vector<int> batches{1};
  std::vector<int> contexts{4096};
  std::vector<double> budgets{1.0};
  int prompt = 0;
  int steps = 16;
  int warmup = 3;
  std::string hw = "h200";
  SamplingOptions sampling;  // how each decode step draws its tokens
  bool json = false;
};

#ifdef EKVA_WITH_CUDA

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int64_t pages_for(int64_t tokens, int page_size) {
  return (tokens + page_size - 1) / page_size;
}

// A layout of `sequences` sequences with room for `tokens` tokens each, and its backend.
struct Cache {
  Cache(const DeviceWeights& weights, int sequences, int64_t tokens)
      : layout(weights.model->spec(), sequences, KvFormat{16, DType::kBF16},
               static_cast<int64_t>(sequences) * weights.model->spec().num_layers *
                   weights.model->spec().num_kv_heads * pages_for(tokens, 16)) {
    const size_t free_bytes = cuda::device_memory().free_bytes;
    const size_t need = cuda::kv_pool_device_bytes(layout);
    if (need > free_bytes) {
      fail(ErrorKind::kOutOfMemory,
           "bench: the KV pool of {} sequences x {} tokens needs {} bytes of GPU memory; {} are "
           "free beside the weights",
           sequences, tokens, need, free_bytes);
    }
    backend = weights.backend(*weights.model, layout);
  }
  KvLayout layout;
  std::unique_ptr<Backend> backend;
};

// A token id that varies with the sequence and the position, so that a batch routes as text does
// (the same token everywhere would send every sequence to the same experts).
int32_t token_at(const ModelSpec& spec, int seq, int32_t position) {
  return static_cast<int32_t>((static_cast<int64_t>(seq) * 7919 + position * 104729) %
                              spec.vocab_size);
}

// One decode step of every sequence at its next position; its wall time (the step ends with each
// sequence's token, drawn by `sampler`, on the host, as a server's step does).
double decode_step(const ModelSpec& spec, Cache& cache, Sampler& sampler) {
  ForwardBatch batch;
  for (int s = 0; s < cache.layout.num_sequences(); ++s) {
    const int32_t position = cache.layout.next_position(s);
    batch.add(token_at(spec, s, position), s, position);
  }
  const auto start = Clock::now();
  const StepPlan plan = plan_step(spec, batch, cache.layout);
  std::vector<TokenDraw> draws(plan.logit_rows.size());
  for (TokenDraw& d : draws) d = sampler.next_draw();
  cache.backend->run_tokens(plan, cache.layout, draws);
  return seconds_since(start);
}

nlohmann::json prediction_json(const ModelSpec& spec, const HardwareSpec& hw, const Workload& w,
                               double measured_s) {
  const StepCost model = predict_step(spec, hw, w);
  const StepCost floor = predict_step(spec, hw, w, true);
  return {{"predicted_ms", 1e3 * model.time_s},
          {"datasheet_floor_ms", 1e3 * floor.time_s},
          {"fraction_of_floor", floor.time_s / measured_s},
          {"flops", model.flops},
          {"bytes", model.bytes}};
}

int time_on_device(const BenchArgs& a, Sampler& sampler) {
  if (!cuda::device_available()) {
    fail(ErrorKind::kUnsupported, "bench: no CUDA device is present (bench times the GPU engine)");
  }
  const HardwareSpec hw = find_hardware(a.hw);
  const DeviceWeights weights = weights_on_device(a.model, 0);
  const ModelSpec& spec = weights.model->spec();
  if (!a.json) {
    fmt::print(stderr, "{}: {} bytes of weights on the device in {:.1f} s ({})\n", a.model.model,
               weights.bytes, weights.seconds, weights.random ? "random" : "checkpoint");
  }
  nlohmann::json decode = nlohmann::json::array();
  for (const int batch : a.batches) {
    for (const int context : a.contexts) {
      for (const double budget : a.budgets) {
        const int64_t kept = std::max<int64_t>(1, std::llround(std::min(budget, 1.0) * context));
        Cache cache(weights, batch, kept + a.warmup + a.steps);
        // The kept tokens of a context of `context` (their K/V are zeros: decode reads the same
        // bytes whatever they hold); the next token takes position `context`.
        for (int s = 0; s < batch; ++s) {
          ForwardBatch fill;
          for (int64_t i = 0; i < kept; ++i)
            fill.add(1, s, static_cast<int32_t>(context - kept + i));
          plan_step(spec, fill, cache.layout);
        }
        for (int i = 0; i < a.warmup; ++i) decode_step(spec, cache, sampler);
        std::vector<double> times;
        for (int i = 0; i < a.steps; ++i) times.push_back(decode_step(spec, cache, sampler));
        const double step_s = median(times);
        Workload w;
        w.phase = Phase::kDecode;
        w.batch = batch;
        w.context = context;
        w.retained = budget < 1.0 ? KvRetention::fraction(spec, context, budget)
                                  : KvRetention::full(spec, context);
        nlohmann::json row = {{"batch", batch},
                              {"context", context},
                              {"budget", budget},
                              {"step_ms", 1e3 * step_s},
                              {"tokens_per_s", batch / step_s}};
        row.update(prediction_json(spec, hw, w, step_s));
        if (!a.json) {
          fmt::print(
              "decode  batch {:>3}  context {:>6}  budget {:>4g}  {:>8.3f} ms/step  "
              "{:>9.1f} tok/s  roofline {:>8.3f} ms  floor {:>8.3f} ms ({:.0f}% of floor)\n",
              batch, context, budget, 1e3 * step_s, batch / step_s,
              row["predicted_ms"].get<double>(), row["datasheet_floor_ms"].get<double>(),
              100 * row["fraction_of_floor"].get<double>());
        }
        decode.push_back(row);
      }
    }
  }
  nlohmann::json prefill;
  if (a.prompt > 0) {
    Cache cache(weights, 1, a.prompt);
    std::vector<double> times;
    for (int i = 0; i < a.warmup + a.steps; ++i) {
      cache.layout.clear_sequence(0);
      ForwardBatch batch;
      for (int t = 0; t < a.prompt; ++t) batch.add(token_at(spec, 0, t), 0, t);
      batch.logit_rows = {a.prompt - 1};
      const auto start = Clock::now();
      cache.backend->run(plan_step(spec, batch, cache.layout), cache.layout, nullptr);
      if (i >= a.warmup) times.push_back(seconds_since(start));
    }
    const double step_s = median(times);
    Workload w;
    w.phase = Phase::kPrefill;
    w.batch = 1;
    w.context = a.prompt;
    w.retained = KvRetention::full(spec, a.prompt);
    prefill = {{"prompt", a.prompt}, {"ms", 1e3 * step_s}, {"tokens_per_s", a.prompt / step_s}};
    prefill.update(prediction_json(spec, hw, w, step_s));
    prefill["tflops"] = prefill["flops"].get<double>() / step_s / 1e12;
    if (!a.json) {
      fmt::print(
          "prefill prompt {:>6}  {:>9.2f} ms  {:>9.0f} tok/s  {:>6.1f} TFLOP/s  roofline "
          "{:>8.3f} ms  floor {:.3f} ms ({:.0f}% of floor)\n",
          a.prompt, 1e3 * step_s, a.prompt / step_s, prefill["tflops"].get<double>(),
          prefill["predicted_ms"].get<double>(), prefill["datasheet_floor_ms"].get<double>(),
          100 * prefill["fraction_of_floor"].get<double>());
    }
  }
  if (a.json) {
    const nlohmann::json report = {{"model", a.model.model},
                                   {"weights", weights.random ? "random" : "checkpoint"},
                                   {"weight_bytes", weights.bytes},
                                   {"hardware", a.hw},
                                   {"steps", a.steps},
                                   {"sampling",
                                    {{"temperature", a.sampling.temperature},
                                     {"top_k", a.sampling.top_k},
                                     {"top_p", a.sampling.top_p},
                                     {"seed", a.sampling.seed}}},
                                   {"decode", decode},
                                   {"prefill", prefill}};
    fmt::print("{}\n", report.dump());
  }
  return 0;
}

#else

int time_on_device(const BenchArgs&, Sampler&) {
  fail(ErrorKind::kUnsupported,
       "bench times the GPU engine; this ekva was built without the CUDA backend (configure with "
       "-DEKVA_CUDA=ON where nvcc is installed)");
}

#endif

int run_bench(const BenchArgs& a) {
  Sampler sampler(a.sampling);  // bad sampling values fail before any device work
  return time_on_device(a, sampler);
}

}  // namespace

void add_bench(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "bench",
      "Time prefill and decode steps of the GPU engine beside the Roofline model's prediction");
  auto a = std::make_shared<BenchArgs>();
  add_model_options(cmd, a->model, "Model directory, or a config.json with --random-weights");
  cmd->add_option("--batch", a->batches, "Comma-separated decode batch sizes")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--context", a->contexts, "Comma-separated context lengths of the decode steps")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--budgets", a->budgets,
                  "Comma-separated shares of the context each sequence keeps (1: full KV)")
      ->delimiter(',')
      ->check(CLI::Range(1e-6, 1.0))
      ->capture_default_str();
  cmd->add_option("--prompt", a->prompt, "Prompt length of a timed prefill (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed steps per configuration (the median is reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd->add_option("--hw", a->hw, "Hardware of the Roofline prediction (ekva roofline --list-hw)")
      ->capture_default_str();
  add_sampling_options(cmd, a->sampling);
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->callback([&action, a] { action = [a] { return run_bench(*a); }; });
}

}  // namespace ekva::cli
