#pragma once
// The OpenAI-compatible HTTP server over a Scheduler: POST /v1/completions (plain or server-sent
// events), GET /v1/models, GET /health, GET /metrics (Prometheus text). HTTP threads parse and
// check requests and wait for their tokens; one worker thread owns the Scheduler and steps it.
#include <memory>
#include <string>

#include "model/model.h"
#include "serve/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace ekva::serve {

struct ServerOptions {
  SchedulerOptions scheduler;
  std::string model_name;  // what /v1/models lists and requests may name
};

class Server {
 public:
  // The tokenizer may be null: prompts are then token ids and completions have no text.
  Server(const Model& model, const Tokenizer* tokenizer, const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; port 0 takes a free one. Returns the port (kIo when it fails).
  int bind(const std::string& host, int port);
  // Serves until stop(); call after bind().
  void run();
  // From any thread: cancels what is queued or running (streams end with finish_reason
  // "cancelled"), then stops listening and makes run() return.
  void stop();
  SchedulerStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// GET /metrics's body: the Prometheus text exposition format.
std::string format_metrics(const SchedulerStats& stats, uint64_t rejected_requests);

}  // namespace ekva::serve
