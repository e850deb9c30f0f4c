#include <fmt/core.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/device_args.h"
#include "cli/model_args.h"
#include "cli/policy_args.h"
#include "core/error.h"
#include "io/model_config.h"
#include "serve/server.h"
#include "tokenizer/tokenizer.h"
#ifdef EKVA_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ekva::cli {
namespace {

// The signal that asked the server to stop, 0 until one did. A handler may only set a lock-free
// atomic; a thread that polls it stops the server. (Blocking the signals and waiting for them
// would miss those the kernel hands to threads that started before main, such as OpenBLAS's.)
std::atomic<int> stop_signal{0};

void on_stop_signal(int signal_number) {
  stop_signal = signal_number;
}

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t kv_memory = 0;
  int max_sequences = 8;
  int prefill_chunk = 256;
  bool prefill_first = false;
  PolicyArgs kv;
  DeviceArgs device;
};

// The model a server runs, with its KV capacity where the device sets it.
struct Served {
  std::unique_ptr<Model> model;
  BackendFactory backend;      // empty: the CPU backend
  int64_t capacity_pages = 0;  // 0: the scheduler's default
  std::string weights;         // how the weights got to the device, for the first line
  std::string kv_note;         // where the default KV capacity came from
};

// Bytes in GiB, or MiB below one GiB.
std::string in_gib(double bytes) {
  return bytes >= kGiB ? fmt::format("{:.2f} GiB", bytes / kGiB)
                       : fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0));
}

#ifdef EKVA_WITH_CUDA

// Device memory kept free beside the weights, the KV pool and the step workspaces that
// cuda::step_workspace_bytes bounds: cuBLAS's workspaces, the kernels the runtime loads on their
// first launch, and allocation granularity. A workspace that cannot grow mid-serving fails the
// requests of that step, so the default KV capacity leaves this much rather than fill the device.
constexpr size_t kRuntimeSlackBytes = size_t{512} << 20;

// The weights on the GPU and the KV pages beside them: --kv-memory's, checked to fit with the
// step workspaces before the weights are made, or by default what the device leaves after the
// weights, the workspaces and kRuntimeSlackBytes.
Served serve_on_gpu(const ServeArgs& a, const KvFormat& kv) {
  const ModelSpec spec = load_model_config(a.model.model);
  const int S = a.max_sequences;
  const auto pool_bytes = [&](int64_t pages) {
    return cuda::kv_pool_device_bytes(KvLayout(spec, S, kv, pages));
  };
  const auto margin = [&](int64_t pages) {
    return cuda::step_workspace_bytes(spec, std::max(a.prefill_chunk, S), S, pages, kv.page_size) +
           kRuntimeSlackBytes;
  };
  const int64_t page_bytes = static_cast<int64_t>(KvLayout(spec, 1, kv, 1).page_bytes());
  Served served;
  if (a.kv_memory > 0) {
    served.capacity_pages = a.kv_memory / page_bytes;
    if (served.capacity_pages == 0) {
      fail(ErrorKind::kInvalidArgument, "--kv-memory: {} bytes hold no KV page of {} bytes",
           a.kv_memory, page_bytes);
    }
  }
  const size_t reserve = served.capacity_pages > 0
                             ? pool_bytes(served.capacity_pages) + margin(served.capacity_pages)
                             : margin(0);
  DeviceWeights weights = weights_on_device(a.model, reserve);
  if (served.capacity_pages == 0) {
    // Device bytes per page, the per-slot scratch included (rounded up).
    constexpr int64_t kProbe = int64_t{1} << 20;
    const size_t per_page = (pool_bytes(kProbe) + kProbe - 1) / kProbe;
    const size_t free_bytes = cuda::device_memory().free_bytes;
    const size_t kept = margin(static_cast<int64_t>(free_bytes / per_page));
    if (free_bytes <= kept + per_page) {
      fail(ErrorKind::kOutOfMemory,
           "{}: {} bytes of GPU memory are free after the weights, not more than the {} the step "
           "workspaces keep; no KV page fits",
           a.model.model, free_bytes, kept);
    }
    served.capacity_pages = static_cast<int64_t>((free_bytes - kept) / per_page);
    served.kv_note = fmt::format(
        "; the GPU's {:.1f} GiB free after the weights less {:.1f} GiB kept for step workspaces",
        static_cast<double>(free_bytes) / kGiB, static_cast<double>(kept) / kGiB);
  }
  served.weights = fmt::format("{:.1f} GiB of {} weights on the GPU in {:.1f} s",
                               static_cast<double>(weights.bytes) / kGiB,
                               weights.random ? "random" : "checkpoint", weights.seconds);
  served.model = std::move(weights.model);
  served.backend = std::move(weights.backend);
  return served;
}

#else

Served serve_on_gpu(const ServeArgs&, const KvFormat&) {
  fail(ErrorKind::kUnsupported, "serve on the GPU: this ekva was built without the CUDA backend");
}

#endif

int run_serve(const ServeArgs& a) {
  EngineOptions engine;
  engine.kv = kv_format(a.kv);
  const std::string device = use_device(a.device, a.kv.kv_dtype, engine);
  if (a.model.random_seed && device != "cuda") {
    fail(ErrorKind::kUnsupported,
         "--random-weights: seeded random weights are made on a GPU, and this server would run on "
         "the CPU (--device {}{})",
         a.device.device, a.device.device == "cpu" ? "" : ", no CUDA device is present");
  }
  std::error_code ec;
  if (!a.model.random_seed && std::filesystem::is_regular_file(a.model.model, ec)) {
    fail(ErrorKind::kInvalidArgument,
         "--model {}: a configuration alone has no weights; give the checkpoint's directory, or "
         "--random-weights SEED to serve seeded random weights on the GPU",
         a.model.model);
  }
  Served setup;
  if (device == "cuda") {
    setup = serve_on_gpu(a, engine.kv);
  } else {
    setup.model = Model::load(a.model.model);
    if (a.kv_memory > 0) {
      const size_t page_bytes = KvLayout(setup.model->spec(), 1, engine.kv, 1).page_bytes();
      setup.capacity_pages = a.kv_memory / static_cast<int64_t>(page_bytes);
      if (setup.capacity_pages == 0) {
        fail(ErrorKind::kInvalidArgument, "--kv-memory: {} bytes hold no KV page of {} bytes",
             a.kv_memory, page_bytes);
      }
    }
  }
  const Model& model = *setup.model;
  const ModelSpec& s = model.spec();
  // Random weights have no tokenizer: prompts are token ids.
  std::unique_ptr<Tokenizer> tokenizer;
  if (!a.model.random_seed && has_tokenizer(a.model.model)) {
    tokenizer = load_tokenizer(a.model.model);
  }

  serve::ServerOptions options;
  options.model_name = model_name(a.model.model);
  serve::SchedulerOptions& scheduler = options.scheduler;
  scheduler.max_sequences = a.max_sequences;
  scheduler.prefill_chunk = a.prefill_chunk;
  scheduler.prefill_first = a.prefill_first;
  scheduler.kv = engine.kv;
  scheduler.backend = setup.backend ? setup.backend : engine.backend;
  scheduler.device = device;
  scheduler.policy = make_policy_options(a.kv, s);
  scheduler.kv_capacity_pages = setup.capacity_pages;
  const size_t page_bytes = KvLayout(s, 1, scheduler.kv, 1).page_bytes();

  serve::Server server(model, tokenizer.get(), options);
  const int port = server.bind(a.host, a.port);
  const serve::SchedulerStats stats = server.stats();
  if (!setup.weights.empty()) fmt::print(stderr, "ekva serve: {}\n", setup.weights);
  fmt::print(stderr,
             "ekva serve: {} on http://{}:{} ({}, KV {} pages of {} bytes = {}{}, {} "
             "sequences at most, policy {}{}{}); Ctrl-C stops\n",
             options.model_name, a.host, port, device, stats.capacity_pages, page_bytes,
             in_gib(static_cast<double>(stats.capacity_pages) * static_cast<double>(page_bytes)),
             setup.kv_note, a.max_sequences, a.kv.policy,
             tokenizer ? "" : ", no tokenizer: prompts are token ids",
             a.prefill_first ? ", prefill first" : "");
  std::atomic<bool> served{false};
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end
  std::thread watcher([&] {
    while (!served && stop_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stop_signal != 0) {
      fmt::print(stderr, "ekva serve: {} received, stopping\n", strsignal(stop_signal));
      server.stop();
    }
  });
  server.run();
  served = true;
  watcher.join();
  server.stop();
  const serve::SchedulerStats end = server.stats();
  fmt::print(stderr, "ekva serve: stopped after {} requests, {} tokens generated\n",
             end.finished + end.cancelled + end.failed, end.generated_tokens);
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (/v1/completions) with continuous batching");
  auto a = std::make_shared<ServeArgs>();
  add_model_options(cmd, a->model,
                    "Model directory, or a config.json with --random-weights (GPU only)");
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port to listen on; 0 picks a free one")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--kv-memory", a->kv_memory,
                  "Bytes of KV pages (K and V at the stored element type); requests are admitted "
                  "while the pages they can need are free (default: on the GPU, what the device "
                  "leaves after the weights and the step workspaces; on the CPU, every sequence "
                  "at the model's full context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-sequences", a->max_sequences, "Requests decoded together at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Prompt tokens prefilled per step at most, so running decodes wait at most one "
                  "chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--prefill-first", a->prefill_first,
                "Run no decode step while an admitted prompt is left to prefill, so the batch "
                "grows to what the KV memory admits (throughput runs; running decodes then wait "
                "for every prefill)");
  add_policy_options(cmd, a->kv);
  add_device_option(cmd, a->device);
  cmd->callback([&action, a] { action = [a] { return run_serve(*a); }; });
}

}  // namespace ekva::cli
