#pragma once
// A client that replays a seeded workload against a running server (`ekva loadgen`): requests of
// random token ids, streamed, with a fixed number of output tokens each, from a fixed number of
// concurrent connections. It measures what a user of the server sees.
#include <cstdint>
#include <optional>
#include <string>
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
};

// Reads the model's vocabulary from GET /v1/models, then replays the workload. A server that
// cannot be reached is a kIo error; failed requests are counted, not thrown.
LoadgenResult run_loadgen(const LoadgenOptions& options);

// The nearest-rank percentile (q in [0, 100]) of the values; 0 for none.
double percentile(std::vector<double> values, double q);

}  // namespace ekva::serve
