#include "serve/loadgen.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/error.h"

namespace ekva::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kErrorsKept = 5;

struct Timing {
  double ttft = 0.0;
  std::vector<double> gaps;  // one per token after the first
  int64_t tokens = 0;
};

std::unique_ptr<httplib::Client> connect(const std::string& url, int timeout_s) {
  auto client = std::make_unique<httplib::Client>(url);
  if (!client->is_valid()) fail(ErrorKind::kInvalidArgument, "--url: '{}' is not a valid URL", url);
  // A request can wait in the server's queue behind all the others.
  client->set_read_timeout(std::chrono::seconds(timeout_s));
  return client;
}

// The server's metrics now; none when it has no /metrics that parses.
std::optional<std::map<std::string, double>> scrape(httplib::Client& client) {
  const httplib::Result res = client.Get("/metrics");
  if (!res || res->status != 200) return std::nullopt;
  std::map<std::string, double> values = parse_metrics(res->body);
  if (!values.contains("ekva_generated_tokens_total")) return std::nullopt;
  return values;
}

ServerMetrics server_metrics(const std::map<std::string, double>& before,
                             const std::map<std::string, double>& after) {
  const auto at = [](const std::map<std::string, double>& m, const char* name) {
    const auto it = m.find(name);
    return it == m.end() ? 0.0 : it->second;
  };
  const auto count = [&](const char* name) {
    return static_cast<int64_t>(std::llround(at(after, name)));
  };
  ServerMetrics s;
  s.kv_capacity_pages = count("ekva_kv_pages_capacity");
  s.kv_page_bytes = count("ekva_kv_page_bytes");
  s.peak_running = count("ekva_running_sequences_peak");
  s.peak_decode_batch = count("ekva_decode_batch_size_peak");
  s.decode_steps = count("ekva_decode_steps_total") -
                   static_cast<int64_t>(std::llround(at(before, "ekva_decode_steps_total")));
  s.decode_tokens = count("ekva_decode_tokens_total") -
                    static_cast<int64_t>(std::llround(at(before, "ekva_decode_tokens_total")));
  s.decode_seconds =
      at(after, "ekva_decode_seconds_total") - at(before, "ekva_decode_seconds_total");
  s.peak_batch_steps = count("ekva_decode_peak_batch_steps");
  s.peak_batch_seconds = at(after, "ekva_decode_peak_batch_seconds");
  s.peak_batch_forward_seconds = at(after, "ekva_decode_peak_batch_forward_seconds");
  s.peak_batch_evict_seconds = at(after, "ekva_decode_peak_batch_evict_seconds");
  return s;
}

// One streamed completion of a JSON body; its timing, or an error message.
std::optional<std::string> stream_one(httplib::Client& client, const std::string& body,
                                      Timing& timing) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  std::string pending;
  std::optional<std::string> error;
  const auto sent = Clock::now();
  auto last = sent;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (!event.starts_with("data: ") || event == "data: [DONE]") continue;
      const json chunk = json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || !chunk.contains("choices")) {
        error = "a stream event is not a completion chunk: " + event.substr(0, 80);
        return false;
      }
      if (chunk.contains("error")) error = chunk["error"].value("message", "server error");
      const size_t k = chunk["choices"][0].value("token_ids", json::array()).size();
      if (k == 0) continue;
      const auto now = Clock::now();
      const double gap = std::chrono::duration<double>(now - last).count();
      if (timing.tokens == 0) {
        timing.ttft = gap;
        for (size_t i = 1; i < k; ++i) timing.gaps.push_back(0.0);
      } else {
        for (size_t i = 0; i < k; ++i) timing.gaps.push_back(gap / static_cast<double>(k));
      }
      timing.tokens += static_cast<int64_t>(k);
      last = now;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error http_error = httplib::Error::Success;
  if (!client.send(req, res, http_error) && !error) {
    return fmt::format("HTTP request failed: {}", httplib::to_string(http_error));
  }
  if (res.status != 200 && !error) {
    return fmt::format("HTTP {}: {}", res.status, res.body.substr(0, 200));
  }
  return error;
}

}  // namespace

std::map<std::string, double> parse_metrics(std::string_view text) {
  std::map<std::string, double> values;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string line(text.substr(0, end));
    text.remove_prefix(std::min(end + 1, text.size()));
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0) continue;
    const std::string name = line.substr(0, space);
    if (name.find('{') != std::string::npos) continue;  // labelled samples are not read
    try {
      values[name] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {  // not a number: skipped
    }
  }
  return values;
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t rank =
      static_cast<size_t>(std::ceil(q / 100.0 * static_cast<double>(values.size())));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

LoadgenResult run_loadgen(const LoadgenOptions& o) {
  if (o.requests < 1 || o.concurrency < 1 || o.prompt_tokens < 1 || o.max_tokens < 1 ||
      o.timeout_s < 1) {
    fail(ErrorKind::kInvalidArgument,
         "requests, concurrency, prompt tokens, max tokens and the timeout must be >= 1");
  }
  const auto probe = connect(o.url, o.timeout_s);
  const httplib::Result models = probe->Get("/v1/models");
  if (!models) {
    fail(ErrorKind::kIo, "{}: cannot reach the server ({})", o.url,
         httplib::to_string(models.error()));
  }
  const json listing = json::parse(models->body, nullptr, false);
  int64_t vocab = 0;
  if (!listing.is_discarded() && listing.contains("data") && !listing["data"].empty()) {
    vocab = listing["data"][0].value("vocab_size", int64_t{0});
  }
  if (models->status != 200 || vocab <= 0) {
    fail(ErrorKind::kInvalidFile, "{}/v1/models: no model with a vocab_size", o.url);
  }

  // Every body is written before any is sent, so the workload does not depend on the timing and
  // long prompts cost no time while requests are in flight: the ids as text, the other fields
  // through the JSON writer.
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> id(0, vocab - 1);
  std::vector<std::string> bodies(o.requests);
  for (int i = 0; i < o.requests; ++i) {
    json fields = {{"max_tokens", o.max_tokens},
                   {"seed", o.seed + static_cast<uint64_t>(i)},
                   {"stream", true},
                   {"ignore_eos", true}};
    if (o.kv_policy) fields["kv_policy"] = *o.kv_policy;
    if (o.kv_budget) fields["kv_budget"] = *o.kv_budget;
    std::string& b = bodies[i];
    b.reserve(static_cast<size_t>(o.prompt_tokens) * 7 + 200);
    b = "{\"prompt\": [";
    for (int t = 0; t < o.prompt_tokens; ++t) {
      if (t > 0) b += ',';
      b += std::to_string(id(rng));
    }
    b += "], ";
    b += fields.dump().substr(1);  // the other fields and the closing brace
  }
  const std::optional<std::map<std::string, double>> before = scrape(*probe);

  LoadgenResult r;
  std::vector<Timing> timings(o.requests);
  std::vector<uint8_t> ok(o.requests, 0);
  std::mutex errors_mutex;
  std::atomic<int> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < std::min(o.concurrency, o.requests); ++w) {
    workers.emplace_back([&] {
      const auto client = connect(o.url, o.timeout_s);
      for (int i; (i = next++) < o.requests;) {
        const std::optional<std::string> error = stream_one(*client, bodies[i], timings[i]);
        if (!error) {
          ok[i] = 1;
          continue;
        }
        const std::lock_guard lock(errors_mutex);
        if (r.errors.size() < kErrorsKept) r.errors.push_back(*error);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::optional<std::map<std::string, double>> after = scrape(*probe);
  if (before && after) r.server = server_metrics(*before, *after);

  std::vector<double> ttft, gaps;
  for (int i = 0; i < o.requests; ++i) {
    if (!ok[i]) {
      ++r.failed;
      continue;
    }
    ++r.completed;
    r.output_tokens += timings[i].tokens;
    ttft.push_back(timings[i].ttft);
    gaps.insert(gaps.end(), timings[i].gaps.begin(), timings[i].gaps.end());
  }
  r.output_tokens_per_s = r.seconds > 0 ? static_cast<double>(r.output_tokens) / r.seconds : 0.0;
  r.ttft_p50 = percentile(ttft, 50);
  r.ttft_p99 = percentile(ttft, 99);
  r.itl_p50 = percentile(gaps, 50);
  r.itl_p99 = percentile(gaps, 99);
  return r;
}

}  // namespace ekva::serve
