#include "serve/server.h"

#include <httplib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "serve/completion.h"

namespace ekva::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One completion as its HTTP thread and the worker share it.
struct Completion {
  explicit Completion(const Tokenizer* tokenizer, std::vector<std::string> stop)
      : text(tokenizer, std::move(stop)) {}

  std::mutex mutex;
  std::condition_variable changed;
  CompletionText text;
  std::vector<int32_t> tokens;  // every generated id
  size_t tokens_sent = 0;       // streaming: ids already in a chunk
  std::optional<uint64_t> id;   // the scheduler's, once submitted
  bool finished = false;
  FinishReason reason = FinishReason::kLength;
  std::string error;
};

json error_body(const std::string& message, const std::string& type,
                const std::optional<std::string>& field) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", field ? json(*field) : json()},
            {"code", json()}}}};
}

// OpenMP's thread count is a per-thread setting: a new thread's team would take every core, not
// the count its creator chose (the CLI leaves the cores other processes keep busy). Returns what
// makes another thread take the calling thread's count.
std::function<void()> inherit_openmp_threads() {
#ifdef _OPENMP
  return [threads = omp_get_max_threads()] { omp_set_num_threads(threads); };
#else
  return [] {};  // the fuzz build has no OpenMP
#endif
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

}  // namespace

struct Server::State {
  State(const Model& model, const Tokenizer* tok, const ServerOptions& options)
      : spec(model.spec()),
        tokenizer(tok),
        server_options(options),
        scheduler(model, options.scheduler),
        created(std::time(nullptr)) {}

  const ModelSpec& spec;
  const Tokenizer* tokenizer;
  ServerOptions server_options;
  Scheduler scheduler;  // the worker's alone
  std::time_t created;
  httplib::Server http;

  std::mutex mutex;  // guards what follows
  std::condition_variable wake;
  std::vector<std::function<void(Scheduler&)>> inbox;
  bool stopping = false;
  SchedulerStats published;
  std::thread worker;

  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> next_completion{1};
  std::atomic<bool> running{false};
  std::atomic<bool> run_returned{false};

  // Hands a command to the worker; false once the server stops.
  bool post(std::function<void(Scheduler&)> command) {
    {
      const std::lock_guard lock(mutex);
      if (stopping) return false;
      inbox.push_back(std::move(command));
    }
    wake.notify_one();
    return true;
  }

  void work() {
    for (;;) {
      std::vector<std::function<void(Scheduler&)>> commands;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return stopping || !inbox.empty() || !scheduler.idle(); });
        if (stopping) break;
        commands.swap(inbox);
      }
      for (auto& command : commands) command(scheduler);
      if (!scheduler.idle()) scheduler.step();
      const SchedulerStats stats = scheduler.stats();
      const std::lock_guard lock(mutex);
      published = stats;
    }
    // Requests posted before the stop still reach the scheduler, so that each one ends (and its
    // HTTP thread returns) through cancel_all.
    for (auto& command : inbox) command(scheduler);
    inbox.clear();
    scheduler.cancel_all();
    const SchedulerStats stats = scheduler.stats();
    const std::lock_guard lock(mutex);
    published = stats;
  }

  void reject(httplib::Response& res, const FieldError& e) {
    ++rejected;
    send_json(res, 400, error_body(e.what(), "invalid_request_error", e.field()));
  }

  void completions(const httplib::Request& req, httplib::Response& res) {
    const CompletionLimits limits{&spec, tokenizer, server_options.model_name};
    CompletionRequest r;
    GenerationRequest g;
    try {
      r = parse_completion_request(req.body, limits);
      PolicyOptions policy = server_options.scheduler.policy;
      if (r.kv_policy) policy.name = *r.kv_policy;
      if (r.kv_budget) policy.budget = r.kv_budget;
      try {
        scheduler.check_policy(policy);
      } catch (const Error& e) {
        throw FieldError(r.kv_budget && !r.kv_policy ? "kv_budget" : "kv_policy", e.what());
      }
      const int prompt_len = static_cast<int>(r.prompt.size());
      if (scheduler.pages_to_admit(prompt_len, 1) > scheduler.capacity_pages()) {
        throw FieldError("prompt", fmt::format("'prompt': {} tokens need {} KV pages, more than "
                                               "the server's {}",
                                               prompt_len, scheduler.pages_to_admit(prompt_len, 1),
                                               scheduler.capacity_pages()));
      }
      if (scheduler.pages_to_admit(prompt_len, r.max_tokens) > scheduler.capacity_pages()) {
        throw FieldError(
            "max_tokens",
            fmt::format("'max_tokens': the prompt and {} tokens can need {} KV "
                        "pages, more than the server's {}",
                        r.max_tokens, scheduler.pages_to_admit(prompt_len, r.max_tokens),
                        scheduler.capacity_pages()));
      }
      g.policy = std::move(policy);
    } catch (const FieldError& e) {
      reject(res, e);
      return;
    }
    g.prompt = r.prompt;
    g.max_tokens = r.max_tokens;
    g.sampling = r.sampling;
    g.stop_at_eos = !r.ignore_eos;
    auto completion = std::make_shared<Completion>(tokenizer, r.stop);
    g.on_token = [completion](int32_t token) {
      const std::lock_guard lock(completion->mutex);
      completion->tokens.push_back(token);
      const bool go_on = completion->text.add(token);
      completion->changed.notify_all();
      return go_on;
    };
    g.on_finish = [completion](FinishReason reason, const std::string& message) {
      const std::lock_guard lock(completion->mutex);
      completion->finished = true;
      completion->reason = reason;
      completion->error = message;
      completion->changed.notify_all();
    };
    const bool posted = post([completion, g = std::move(g)](Scheduler& s) mutable {
      try {
        const uint64_t id = s.submit(std::move(g));
        const std::lock_guard lock(completion->mutex);
        completion->id = id;
      } catch (const Error& e) {
        const std::lock_guard lock(completion->mutex);
        completion->finished = true;
        completion->reason = FinishReason::kError;
        completion->error = e.what();
        completion->changed.notify_all();
      }
    });
    if (!posted) {
      send_json(res, 503, error_body("the server is stopping", "unavailable", std::nullopt));
      return;
    }
    const std::string id = fmt::format("cmpl-{}", next_completion++);
    const int prompt_tokens = static_cast<int>(r.prompt.size());
    if (r.stream) {
      stream(res, completion, id);
    } else {
      std::unique_lock lock(completion->mutex);
      completion->changed.wait(lock, [&] { return completion->finished; });
      if (completion->reason == FinishReason::kError) {
        send_json(res, 500, error_body(completion->error, "server_error", std::nullopt));
        return;
      }
      const int n = static_cast<int>(completion->tokens.size());
      send_json(res, 200,
                {{"id", id},
                 {"object", "text_completion"},
                 {"created", std::time(nullptr)},
                 {"model", server_options.model_name},
                 {"choices",
                  {{{"index", 0},
                    {"text", completion->text.take_ready(true)},
                    {"token_ids", completion->tokens},
                    {"logprobs", json()},
                    {"finish_reason", finish_reason_name(completion->reason)}}}},
                 {"usage",
                  {{"prompt_tokens", prompt_tokens},
                   {"completion_tokens", n},
                   {"total_tokens", prompt_tokens + n}}}});
    }
  }

  void stream(httplib::Response& res, const std::shared_ptr<Completion>& completion,
              const std::string& id) {
    const std::string model = server_options.model_name;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [completion, id, model](size_t, httplib::DataSink& sink) {
          std::unique_lock lock(completion->mutex);
          completion->changed.wait(lock, [&] {
            return completion->finished || completion->tokens.size() > completion->tokens_sent;
          });
          const std::vector<int32_t> fresh(
              completion->tokens.begin() + static_cast<ptrdiff_t>(completion->tokens_sent),
              completion->tokens.end());
          completion->tokens_sent = completion->tokens.size();
          const bool finished = completion->finished;
          json choice = {{"index", 0},
                         {"text", completion->text.take_ready(finished)},
                         {"token_ids", fresh},
                         {"logprobs", json()},
                         {"finish_reason", json()}};
          if (finished) choice["finish_reason"] = finish_reason_name(completion->reason);
          json chunk = {{"id", id},
                        {"object", "text_completion"},
                        {"created", std::time(nullptr)},
                        {"model", model},
                        {"choices", json::array({choice})}};
          if (finished && completion->reason == FinishReason::kError) {
            chunk["error"] = {{"message", completion->error}, {"type", "server_error"}};
          }
          lock.unlock();
          const std::string event = "data: " + chunk.dump() + "\n\n";
          if (!sink.write(event.data(), event.size())) return false;
          if (finished) {
            static constexpr std::string_view kDone = "data: [DONE]\n\n";
            if (!sink.write(kDone.data(), kDone.size())) return false;
            sink.done();
          }
          return true;
        },
        // A stream that did not end well lost its client: its request is cancelled at once, so
        // its pages go back to the pool before the next step.
        [this, completion](bool success) {
          if (success) return;
          post([completion](Scheduler& s) {
            std::optional<uint64_t> request;
            {
              const std::lock_guard lock(completion->mutex);
              request = completion->id;
            }
            if (request) s.cancel(*request);
          });
        });
  }

  void routes() {
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      completions(req, res);
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json model = {{"id", server_options.model_name},
                          {"object", "model"},
                          {"created", created},
                          {"owned_by", "ekva"},
                          {"max_model_len", spec.max_position},
                          {"vocab_size", spec.vocab_size}};
      send_json(res, 200, {{"object", "list"}, {"data", json::array({model})}});
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200, {{"status", "ok"}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      // Read by the worker between steps, so that a request whose response has been sent is in
      // the counters (the snapshot published after each step may not have caught up yet).
      auto stats = std::make_shared<std::promise<SchedulerStats>>();
      std::future<SchedulerStats> read = stats->get_future();
      if (!post([stats](Scheduler& s) { stats->set_value(s.stats()); })) {
        const std::lock_guard lock(mutex);
        stats->set_value(published);
      }
      res.set_content(format_metrics(read.get(), rejected.load()), "text/plain; version=0.0.4");
    });
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      send_json(
          res, res.status,
          error_body(fmt::format("HTTP {}", res.status), "invalid_request_error", std::nullopt));
    });
    http.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
          std::string message = "internal error";
          try {
            std::rethrow_exception(error);
          } catch (const std::exception& e) {
            message = e.what();
          } catch (...) {
          }
          send_json(res, 500, error_body(message, "server_error", std::nullopt));
        });
  }
};

Server::Server(const Model& model, const Tokenizer* tokenizer, const ServerOptions& options)
    : state_(std::make_unique<State>(model, tokenizer, options)) {
  State& s = *state_;
  s.published = s.scheduler.stats();
  // Each connection holds an HTTP thread while its request waits and streams, so there are
  // enough for every sequence and as many queued behind them.
  const size_t threads =
      std::max<size_t>(8, 4 * static_cast<size_t>(options.scheduler.max_sequences));
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.http.set_payload_max_length(64u << 20);
  s.routes();
  s.worker = std::thread([&s, inherit = inherit_openmp_threads()] {
    inherit();
    s.work();
  });
}

Server::~Server() {
  stop();
}

int Server::bind(const std::string& host, int port) {
  const int bound = port == 0 ? state_->http.bind_to_any_port(host)
                              : (state_->http.bind_to_port(host, port) ? port : -1);
  if (bound < 0) fail(ErrorKind::kIo, "cannot listen on {}:{}", host, port);
  return bound;
}

void Server::run() {
  state_->running = true;
  state_->http.listen_after_bind();
  state_->run_returned = true;
}

void Server::stop() {
  State& s = *state_;
  {
    const std::lock_guard lock(s.mutex);
    s.stopping = true;
  }
  s.wake.notify_one();
  if (s.worker.joinable()) s.worker.join();
  // run() may not have started listening yet: stop until it has returned.
  while (s.running && !s.run_returned) {
    s.http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

SchedulerStats Server::stats() const {
  const std::lock_guard lock(state_->mutex);
  return state_->published;
}

std::string format_metrics(const SchedulerStats& s, uint64_t rejected_requests) {
  std::string out;
  auto metric = [&out](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  metric("ekva_requests_admitted_total", "counter", "Requests that got a sequence.", s.admitted);
  metric("ekva_requests_finished_total", "counter", "Requests ended by length or stop.",
         s.finished);
  metric("ekva_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
         s.cancelled);
  metric("ekva_requests_failed_total", "counter", "Requests ended by an engine error.", s.failed);
  metric("ekva_requests_rejected_total", "counter", "Requests refused with a 4xx.",
         rejected_requests);
  metric("ekva_prompt_tokens_total", "counter", "Prompt tokens prefilled.", s.prompt_tokens);
  metric("ekva_generated_tokens_total", "counter", "Tokens generated.", s.generated_tokens);
  metric("ekva_kv_pages_capacity", "gauge", "KV pages the server may use.", s.capacity_pages);
  metric("ekva_kv_page_bytes", "gauge", "Bytes of K and V one KV page holds.", s.page_bytes);
  metric("ekva_kv_pages_in_use", "gauge", "KV pages holding tokens.", s.pages_in_use);
  metric("ekva_kv_pages_free", "gauge", "KV pages not in use.", s.capacity_pages - s.pages_in_use);
  metric("ekva_kv_pages_reserved", "gauge", "KV pages admitted requests can still need.",
         s.pages_reserved);
  metric("ekva_queue_length", "gauge", "Requests waiting for admission.", s.queued);
  metric("ekva_running_sequences", "gauge", "Requests prefilling or decoding.", s.running);
  metric("ekva_decode_batch_size", "gauge", "Sequences in the last decode step.",
         s.last_decode_batch);
  metric("ekva_running_sequences_peak", "gauge", "The most requests admitted at once.",
         s.peak_running);
  metric("ekva_decode_batch_size_peak", "gauge", "The most sequences in one decode step.",
         s.peak_decode_batch);
  metric("ekva_decode_steps_total", "counter", "Engine decode steps.", s.decode_steps);
  metric("ekva_decode_tokens_total", "counter", "Tokens decoded by engine decode steps.",
         s.decode_tokens);
  metric("ekva_decode_seconds_total", "counter",
         "Time in engine decode steps (their evictions included).", s.decode_seconds);
  metric("ekva_decode_peak_batch_steps", "gauge",
         "Decode steps at the peak decode batch size (since it was reached).", s.peak_batch_steps);
  metric("ekva_decode_peak_batch_seconds", "gauge",
         "Time in decode steps at the peak decode batch size (since it was reached).",
         s.peak_batch_seconds);
  metric("ekva_decode_peak_batch_forward_seconds", "gauge",
         "Of ekva_decode_peak_batch_seconds, the forward passes (up to the logits on the host).",
         s.peak_batch_forward_seconds);
  metric("ekva_decode_peak_batch_evict_seconds", "gauge",
         "Of ekva_decode_peak_batch_seconds, the KV policies' evictions.",
         s.peak_batch_evict_seconds);
  metric("ekva_step_seconds_total", "counter", "Time spent in engine iterations.", s.step_seconds);
  metric("ekva_steps_total", "counter", "Engine iterations.", s.steps);
  metric("ekva_last_step_seconds", "gauge", "Duration of the last engine iteration.",
         s.last_step_seconds);
  return out;
}

}  // namespace ekva::serve
