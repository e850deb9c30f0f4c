#pragma once
// Continuous batching over one Engine, independent of HTTP. Requests wait in a FIFO queue until
// the KV pages they can need are unreserved and a sequence is free; then their prompt is prefilled
// in chunks (one chunk per iteration, so running decodes wait at most one chunk), compressed by the
// request's own policy, and they join the batch that every iteration decodes in one engine step;
// they leave when done. Sampling is generate's Sampler, so a request gives the tokens `ekva
// generate` gives for the same prompt, seed and policy. With prefill_first, an iteration that
// prefills decodes nothing, so that the batch grows to what the KV memory admits (throughput
// measurements). Not thread-safe: one thread drives it.
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/generate.h"
#include "kv/policy.h"
#include "model/model.h"

namespace ekva::serve {

enum class FinishReason { kLength, kStop, kCancelled, kError };

// "length", "stop", "cancelled", "error": the names OpenAI's finish_reason uses where it has one.
const char* finish_reason_name(FinishReason reason);

struct SchedulerOptions {
  int max_sequences = 8;    // sequences decoded together at most
  int prefill_chunk = 256;  // prompt tokens prefilled per iteration at most
  // No decode step while an admitted request has prompt left to prefill: running decodes wait for
  // every prefill (and would starve under an endless stream of arrivals), and the decode batch
  // reaches what the memory admits. Off: each iteration prefills one chunk and decodes.
  bool prefill_first = false;
  KvFormat kv;                    // page size and stored element type
  int64_t kv_capacity_pages = 0;  // 0: every sequence at the model's full context
  BackendFactory backend;         // empty: the CPU backend
  std::string device;             // what runs `backend` (EngineOptions::device)
  PolicyOptions policy;           // requests without their own policy use this one
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;  // clamped to the context as generate clamps it
  SamplingOptions sampling;
  bool stop_at_eos = true;
  std::optional<PolicyOptions> policy;  // none: the scheduler's
  // Each sampled token, on the scheduler's thread; returning false ends the request with kStop
  // (the caller found a stop string).
  std::function<bool(int32_t)> on_token;
  // Once, when the request leaves the scheduler; the message is set for kError.
  std::function<void(FinishReason, const std::string&)> on_finish;
};

struct SchedulerStats {
  int64_t capacity_pages = 0;
  int64_t page_bytes = 0;  // K and V of one page, at the stored element type
  int64_t pages_in_use = 0;
  int64_t pages_reserved = 0;  // what admitted requests can still need; never above capacity
  int queued = 0;
  int running = 0;            // admitted: prefilling or decoding
  int last_decode_batch = 0;  // sequences in the last decode step
  int peak_running = 0;       // the most requests admitted at once
  int peak_decode_batch = 0;  // the most sequences in one decode step
  uint64_t admitted = 0;      // requests that got a sequence
  uint64_t finished = 0;      // ended by length or stop
  uint64_t cancelled = 0;
  uint64_t failed = 0;
  uint64_t prompt_tokens = 0;     // prefilled
  uint64_t generated_tokens = 0;  // sampled
  uint64_t steps = 0;             // iterations that ran the engine
  double step_seconds = 0.0;      // summed over those iterations
  double last_step_seconds = 0.0;
  // The engine's decode steps alone (their evictions included, prefill chunks not).
  uint64_t decode_steps = 0;
  uint64_t decode_tokens = 0;
  double decode_seconds = 0.0;
  // The decode steps at peak_decode_batch sequences (counted afresh when the peak rises).
  uint64_t peak_batch_steps = 0;
  double peak_batch_seconds = 0.0;
  // Of peak_batch_seconds, the engine's forward passes and its evictions (Engine::DecodeTimes);
  // the rest is the step's bookkeeping around them.
  double peak_batch_forward_seconds = 0.0;
  double peak_batch_evict_seconds = 0.0;
};

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options);
  ~Scheduler();

  // Pages a request must find unreserved to be admitted. Its whole prompt is held until it is
  // compressed, and its decode can keep every token, so a full cache of the prompt and the tokens
  // decoded bounds it; after compression its reservation shrinks to what its policy can keep.
  // Reads only constants, so any thread may call it.
  int64_t pages_to_admit(int prompt_len, int max_tokens) const;
  int64_t capacity_pages() const { return capacity_pages_; }
  // What the engine refuses of a policy (Engine::check_policy); reads only constants, so any
  // thread may call it.
  void check_policy(const PolicyOptions& policy) const { engine_.check_policy(policy); }

  // Checks the request (kInvalidArgument; kOutOfMemory when it could never be admitted) and
  // queues it. Returns its id.
  uint64_t submit(GenerationRequest request);
  // Ends a queued or running request at once, freeing its sequence and pages (on_finish with
  // kCancelled). False when no such request is waiting or running.
  bool cancel(uint64_t id);
  void cancel_all();
  bool idle() const { return queue_.empty() && running_.empty(); }
  // One iteration: admit from the queue head while pages and sequences allow, prefill one chunk,
  // then decode every sequence that has a token to decode, in one engine step.
  void step();
  SchedulerStats stats() const;

 private:
  struct Active;

  const ModelSpec& spec() const { return engine_.model().spec(); }

  void admit();
  bool prefill_next();
  bool decode_running();
  // Counts a decode step of `batch` sequences that took `seconds`.
  void count_decode(int batch, double seconds, const Engine::DecodeTimes& phases);
  // After a token was sampled: ends the request when it is done, else queues the token to decode.
  void emit(Active& a, int32_t token);
  void finish(Active& a, FinishReason reason, const std::string& message = {});
  void remove_finished();

  Engine engine_;
  SchedulerOptions options_;
  int64_t capacity_pages_;
  std::deque<std::unique_ptr<Active>> queue_;
  std::vector<std::unique_ptr<Active>> running_;  // in admission order
  std::vector<int> free_sequences_;
  int64_t pages_reserved_ = 0;
  uint64_t next_id_ = 1;
  SchedulerStats counters_;
};

}  // namespace ekva::serve
