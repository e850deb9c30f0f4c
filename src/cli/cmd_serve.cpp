#include <fmt/core.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/device_args.h"
#include "cli/policy_args.h"
#include "core/error.h"
#include "serve/server.h"
#include "tokenizer/tokenizer.h"

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
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8000;
  int64_t kv_memory = 0;
  int max_sequences = 8;
  int prefill_chunk = 256;
  PolicyArgs kv;
  DeviceArgs device;
};

int run_serve(const ServeArgs& a) {
  const auto model = Model::load(a.model_dir);
  const ModelSpec& s = model->spec();
  std::unique_ptr<Tokenizer> tokenizer;
  if (has_tokenizer(a.model_dir)) tokenizer = load_tokenizer(a.model_dir);

  serve::ServerOptions options;
  options.model_name = std::filesystem::path(a.model_dir).lexically_normal().filename().string();
  if (options.model_name.empty()) {  // a directory given with a trailing slash
    options.model_name =
        std::filesystem::path(a.model_dir).lexically_normal().parent_path().filename().string();
  }
  serve::SchedulerOptions& scheduler = options.scheduler;
  scheduler.max_sequences = a.max_sequences;
  scheduler.prefill_chunk = a.prefill_chunk;
  EngineOptions engine;
  engine.kv = kv_format(a.kv);
  const std::string device = use_device(a.device, a.kv.kv_dtype, engine);
  scheduler.kv = engine.kv;
  scheduler.backend = engine.backend;
  scheduler.policy = make_policy_options(a.kv, s);
  const size_t page_bytes = KvLayout(s, 1, scheduler.kv, 1).page_bytes();
  if (a.kv_memory > 0) {
    scheduler.kv_capacity_pages = a.kv_memory / static_cast<int64_t>(page_bytes);
    if (scheduler.kv_capacity_pages == 0) {
      fail(ErrorKind::kInvalidArgument, "--kv-memory: {} bytes hold no KV page of {} bytes",
           a.kv_memory, page_bytes);
    }
  }

  serve::Server server(*model, tokenizer.get(), options);
  const int port = server.bind(a.host, a.port);
  const serve::SchedulerStats stats = server.stats();
  fmt::print(stderr,
             "ekva serve: {} on http://{}:{} ({}, KV {} pages of {} bytes, {} sequences at most, "
             "policy {}); Ctrl-C stops\n",
             options.model_name, a.host, port, device, stats.capacity_pages, page_bytes,
             a.max_sequences, a.kv.policy);
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
  cmd->add_option("--model", a->model_dir, "Model directory")->required();
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port to listen on; 0 picks a free one")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--kv-memory", a->kv_memory,
                  "Bytes of KV pages; requests are admitted while the pages they can need are "
                  "free (default: every sequence at the model's full context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-sequences", a->max_sequences, "Requests decoded together at most")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk,
                  "Prompt tokens prefilled per step at most, so running decodes wait at most one "
                  "chunk")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_policy_options(cmd, a->kv);
  add_device_option(cmd, a->device);
  cmd->callback([&action, a] { action = [a] { return run_serve(*a); }; });
}

}  // namespace ekva::cli
