#include "serve/scheduler.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "core/error.h"

namespace ekva::serve {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      break;
  }
  return "error";
}

struct Scheduler::Active {
  Active(uint64_t request_id, GenerationRequest r, int token_budget)
      : id(request_id), request(std::move(r)), sampler(request.sampling), budget(token_budget) {}

  uint64_t id;
  GenerationRequest request;
  Sampler sampler;
  int budget;  // tokens to generate at most
  int seq = -1;
  int prefilled = 0;
  int generated = 0;
  int64_t reserved_pages = 0;
  std::optional<int32_t> to_decode;  // the last sampled token, while the request goes on
  bool done = false;
};

Scheduler::Scheduler(const Model& model, const SchedulerOptions& options)
    : engine_(model, EngineOptions{options.max_sequences, options.kv, options.kv_capacity_pages,
                                   options.backend, options.device}),
      options_(options),
      capacity_pages_(engine_.layout().capacity_pages()) {
  if (options.max_sequences < 1) {
    fail(ErrorKind::kInvalidArgument, "max sequences must be >= 1, got {}", options.max_sequences);
  }
  if (options.prefill_chunk < 1) {
    fail(ErrorKind::kInvalidArgument, "prefill chunk must be >= 1 token, got {}",
         options.prefill_chunk);
  }
  engine_.check_policy(options.policy);  // refuses a bad default policy now, not per request
  for (int seq = options.max_sequences - 1; seq >= 0; --seq) free_sequences_.push_back(seq);
}

Scheduler::~Scheduler() = default;

int64_t Scheduler::pages_to_admit(int prompt_len, int max_tokens) const {
  const KvLayout& layout = engine_.layout();
  const int64_t tokens = prompt_len + std::max(max_tokens, 1) - 1;
  return static_cast<int64_t>(layout.full_bytes(tokens) / layout.page_bytes());
}

uint64_t Scheduler::submit(GenerationRequest request) {
  const ModelSpec& s = spec();
  const int prompt_len = static_cast<int>(request.prompt.size());
  if (prompt_len == 0) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (prompt_len > s.max_position) {
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens, longer than the model's context of {}", prompt_len,
         s.max_position);
  }
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= s.vocab_size) {
      fail(ErrorKind::kInvalidArgument, "prompt token {} at index {} is outside [0, {})",
           request.prompt[i], i, s.vocab_size);
    }
  }
  if (request.max_tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "max tokens must be >= 1, got {}", request.max_tokens);
  }
  if (request.policy) engine_.check_policy(*request.policy);  // as set_policy checks it later
  // As generate: stop at the context's end rather than fail, since the prompt fitted.
  const int budget = static_cast<int>(
      std::min<int64_t>(request.max_tokens, static_cast<int64_t>(s.max_position) - prompt_len + 1));
  const int64_t pages = pages_to_admit(prompt_len, budget);
  if (pages > capacity_pages_) {
    fail(ErrorKind::kOutOfMemory,
         "a prompt of {} tokens with {} tokens to generate can need {} KV pages, more than the "
         "capacity of {}",
         prompt_len, budget, pages, capacity_pages_);
  }
  const uint64_t id = next_id_++;
  queue_.push_back(std::make_unique<Active>(id, std::move(request), budget));
  queue_.back()->reserved_pages = pages;
  return id;
}

bool Scheduler::cancel(uint64_t id) {
  const auto queued = std::find_if(queue_.begin(), queue_.end(),
                                   [id](const std::unique_ptr<Active>& a) { return a->id == id; });
  if (queued != queue_.end()) {
    std::unique_ptr<Active> a = std::move(*queued);
    queue_.erase(queued);
    finish(*a, FinishReason::kCancelled);
    return true;
  }
  for (const std::unique_ptr<Active>& a : running_) {
    if (a->id == id && !a->done) {
      finish(*a, FinishReason::kCancelled);
      remove_finished();
      return true;
    }
  }
  return false;
}

void Scheduler::cancel_all() {
  while (!queue_.empty()) cancel(queue_.front()->id);
  while (!running_.empty()) cancel(running_.front()->id);
}

void Scheduler::finish(Active& a, FinishReason reason, const std::string& message) {
  a.done = true;
  a.to_decode.reset();
  if (a.seq >= 0) {
    engine_.clear(a.seq);
    free_sequences_.push_back(a.seq);
    a.seq = -1;
    pages_reserved_ -= a.reserved_pages;
  }
  switch (reason) {
    case FinishReason::kLength:
    case FinishReason::kStop:
      ++counters_.finished;
      break;
    case FinishReason::kCancelled:
      ++counters_.cancelled;
      break;
    case FinishReason::kError:
      ++counters_.failed;
      break;
  }
  if (a.request.on_finish) a.request.on_finish(reason, message);
}

void Scheduler::remove_finished() {
  std::erase_if(running_, [](const std::unique_ptr<Active>& a) { return a->done; });
}

void Scheduler::admit() {
  // FIFO: a head that does not fit yet holds back those behind it, so no request starves.
  while (!queue_.empty() && !free_sequences_.empty() &&
         pages_reserved_ + queue_.front()->reserved_pages <= capacity_pages_) {
    std::unique_ptr<Active> a = std::move(queue_.front());
    queue_.pop_front();
    a->seq = free_sequences_.back();
    free_sequences_.pop_back();
    pages_reserved_ += a->reserved_pages;
    engine_.set_policy(a->seq, a->request.policy ? *a->request.policy : options_.policy);
    ++counters_.admitted;
    running_.push_back(std::move(a));
    counters_.peak_running = std::max(counters_.peak_running, static_cast<int>(running_.size()));
  }
}

void Scheduler::emit(Active& a, int32_t token) {
  ++a.generated;
  ++counters_.generated_tokens;
  const ModelSpec& s = spec();
  const bool go_on = !a.request.on_token || a.request.on_token(token);
  const bool eos = a.request.stop_at_eos &&
                   std::find(s.eos_ids.begin(), s.eos_ids.end(), token) != s.eos_ids.end();
  if (!go_on || eos) {
    finish(a, FinishReason::kStop);
  } else if (a.generated == a.budget) {
    finish(a, FinishReason::kLength);
  } else {
    a.to_decode = token;
  }
}

bool Scheduler::prefill_next() {
  const auto it = std::find_if(running_.begin(), running_.end(), [](const auto& a) {
    return !a->done && a->prefilled < static_cast<int>(a->request.prompt.size());
  });
  if (it == running_.end()) return false;
  Active& a = **it;
  const int prompt_len = static_cast<int>(a.request.prompt.size());
  const int n = std::min(options_.prefill_chunk, prompt_len - a.prefilled);
  try {
    const std::vector<float> logits = engine_.prefill_chunk(
        a.seq, std::span<const int32_t>(a.request.prompt).subspan(a.prefilled, n), prompt_len);
    a.prefilled += n;
    counters_.prompt_tokens += n;
    if (a.prefilled < prompt_len) return true;
    engine_.compress(a.seq, prompt_len);
    // The prompt is compressed: the reservation shrinks to what the policy lets it keep.
    const int64_t bound = std::min(a.reserved_pages, engine_.pages_bound(a.seq, a.budget - 1));
    pages_reserved_ -= a.reserved_pages - bound;
    a.reserved_pages = bound;
    emit(a, a.sampler.sample(logits.data(), spec().vocab_size));
  } catch (const std::exception& e) {  // std::bad_alloc as well: a request fails, not the server
    if (!a.done) finish(a, FinishReason::kError, e.what());
  }
  return true;
}

bool Scheduler::decode_running() {
  std::vector<Active*> batch;
  std::vector<int> seqs;
  std::vector<int32_t> tokens;
  for (const std::unique_ptr<Active>& a : running_) {
    if (a->done || !a->to_decode) continue;
    batch.push_back(a.get());
    seqs.push_back(a->seq);
    tokens.push_back(*a->to_decode);
  }
  counters_.last_decode_batch = static_cast<int>(batch.size());
  if (batch.empty()) return false;
  // Each request draws with its own generator, where the engine keeps the logits.
  std::vector<TokenDraw> draws;
  for (Active* a : batch) draws.push_back(a->sampler.next_draw());
  try {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> sampled = engine_.decode_tokens(seqs, tokens, draws);
    count_decode(static_cast<int>(batch.size()),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 engine_.last_decode_times());
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->to_decode.reset();
      emit(*batch[i], sampled[i]);
    }
  } catch (const std::exception& e) {
    for (Active* a : batch) {
      if (!a->done) finish(*a, FinishReason::kError, e.what());
    }
  }
  return true;
}

void Scheduler::count_decode(int batch, double seconds, const Engine::DecodeTimes& phases) {
  SchedulerStats& c = counters_;
  ++c.decode_steps;
  c.decode_tokens += static_cast<uint64_t>(batch);
  c.decode_seconds += seconds;
  if (batch > c.peak_decode_batch) {
    c.peak_decode_batch = batch;
    c.peak_batch_steps = 0;
    c.peak_batch_seconds = 0.0;
    c.peak_batch_forward_seconds = 0.0;
    c.peak_batch_evict_seconds = 0.0;
  }
  if (batch == c.peak_decode_batch) {
    ++c.peak_batch_steps;
    c.peak_batch_seconds += seconds;
    c.peak_batch_forward_seconds += phases.forward_s;
    c.peak_batch_evict_seconds += phases.evict_s;
  }
}

void Scheduler::step() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  admit();
  const bool prefilled = prefill_next();
  const bool decoded = prefilled && options_.prefill_first ? false : decode_running();
  remove_finished();
  if (prefilled || decoded) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    ++counters_.steps;
    counters_.step_seconds += seconds;
    counters_.last_step_seconds = seconds;
  }
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = counters_;
  s.capacity_pages = capacity_pages_;
  s.page_bytes = static_cast<int64_t>(engine_.layout().page_bytes());
  s.pages_in_use = static_cast<int64_t>(engine_.layout().pages_in_use());
  s.pages_reserved = pages_reserved_;
  s.queued = static_cast<int>(queue_.size());
  s.running = static_cast<int>(running_.size());
  return s;
}

}  // namespace ekva::serve
