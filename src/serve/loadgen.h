#pragma once
// A client that replays a seeded workload against a running server (`ekva loadgen`): requests of
// random token ids, streamed, with a fixed number of output tokens each, from a fixed number of
// concurrent connections. It measures what a user of the server sees, and reads what the server
// saw from its /metrics: the concurrency it reached and the speed of its decode steps.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ekva::serve {

struct LoadgenOptions {
  std::string url;  // http://host:port
  int requests = 32;
  int concurrency = 4;
  int prompt_tokens = 128;
  int max_tokens = 64;
  uint64_t seed = 0;  // the prompts' ids and each request's sampling seed (seed + request index)
  std::optional<std::string> kv_policy;
  std::optional<double> kv_budget;
  int timeout_s = 600;  // how long a request may wait for its response (queue and generation)
};

// What the server's GET /metrics said: its peaks since it started, and its decode steps during the
// run (the difference of its counters before and after).
struct ServerMetrics {
  int64_t kv_capacity_pages = 0;
  int64_t kv_page_bytes = 0;
  int64_t peak_running = 0;       // the most requests admitted at once
  int64_t peak_decode_batch = 0;  // the most sequences in one decode step
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;
  double decode_seconds = 0.0;
  // Decode steps at the peak batch and their time, since the server reached that peak.
  int64_t peak_batch_steps = 0;
  double peak_batch_seconds = 0.0;
  double peak_batch_forward_seconds = 0.0;  // of peak_batch_seconds, the forward passes
  double peak_batch_evict_seconds = 0.0;    // and the evictions

  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0.0;
  }
  double mean_decode_batch() const {
    return decode_steps > 0 ? static_cast<double>(decode_tokens) / decode_steps : 0.0;
  }
  // Tokens per second of the decode steps at the peak batch.
  double peak_batch_tokens_per_s() const {
    return peak_batch_seconds > 0
               ? static_cast<double>(peak_batch_steps * peak_decode_batch) / peak_batch_seconds
               : 0.0;
  }
};

struct LoadgenResult {
  int completed = 0;
  int failed = 0;
  std::vector<std::string> errors;  // the first few failures
  int64_t output_tokens = 0;
  double seconds = 0.0;  // from the first request sent to the last response's end
  double output_tokens_per_s = 0.0;
  // Seconds. Time to first token: from sending to the first chunk with a token. Inter-token
  // latency: between consecutive chunks, shared evenly by the tokens of a chunk.
  double ttft_p50 = 0.0, ttft_p99 = 0.0;
  double itl_p50 = 0.0, itl_p99 = 0.0;
  std::optional<ServerMetrics> server;  // none when the server has no parsable /metrics
};

// Reads the model's vocabulary from GET /v1/models, then replays the workload. A server that
// cannot be reached is a kIo error; failed requests are counted, not thrown.
LoadgenResult run_loadgen(const LoadgenOptions& options);

// The nearest-rank percentile (q in [0, 100]) of the values; 0 for none.
double percentile(std::vector<double> values, double q);

// The samples of a Prometheus text exposition without labels: name to value. Comments and lines
// that are not `name value` are skipped.
std::map<std::string, double> parse_metrics(std::string_view text);

}  // namespace ekva::serve
