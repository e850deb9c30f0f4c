#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "serve/loadgen.h"

namespace ekva::cli {
namespace {

int run_loadgen(const serve::LoadgenOptions& o, bool json) {
  const serve::LoadgenResult r = serve::run_loadgen(o);
  for (const std::string& e : r.errors) fmt::print(stderr, "ekva loadgen: failed: {}\n", e);
  if (json) {
    nlohmann::json j = {{"requests", o.requests},
                        {"concurrency", o.concurrency},
                        {"prompt_tokens", o.prompt_tokens},
                        {"max_tokens", o.max_tokens},
                        {"seed", o.seed},
                        {"completed", r.completed},
                        {"failed", r.failed},
                        {"output_tokens", r.output_tokens},
                        {"seconds", r.seconds},
                        {"output_tokens_per_s", r.output_tokens_per_s},
                        {"ttft_s", {{"p50", r.ttft_p50}, {"p99", r.ttft_p99}}},
                        {"itl_s", {{"p50", r.itl_p50}, {"p99", r.itl_p99}}},
                        {"server", nullptr}};
    if (o.kv_policy) j["kv_policy"] = *o.kv_policy;
    if (o.kv_budget) j["kv_budget"] = *o.kv_budget;
    if (r.server) {
      const serve::ServerMetrics& m = *r.server;
      j["server"] = {{"kv_capacity_pages", m.kv_capacity_pages},
                     {"kv_page_bytes", m.kv_page_bytes},
                     {"kv_bytes", m.kv_capacity_pages * m.kv_page_bytes},
                     {"peak_running", m.peak_running},
                     {"peak_decode_batch", m.peak_decode_batch},
                     {"decode_steps", m.decode_steps},
                     {"decode_tokens", m.decode_tokens},
                     {"decode_seconds", m.decode_seconds},
                     {"decode_tokens_per_s", m.decode_tokens_per_s()},
                     {"mean_decode_batch", m.mean_decode_batch()},
                     {"peak_batch_steps", m.peak_batch_steps},
                     {"peak_batch_seconds", m.peak_batch_seconds},
                     {"peak_batch_forward_seconds", m.peak_batch_forward_seconds},
                     {"peak_batch_evict_seconds", m.peak_batch_evict_seconds},
                     {"peak_batch_tokens_per_s", m.peak_batch_tokens_per_s()}};
    }
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("requests      {} completed, {} failed in {:.2f} s\n", r.completed, r.failed,
               r.seconds);
    fmt::print("output        {} tokens, {:.1f} tokens/s\n", r.output_tokens,
               r.output_tokens_per_s);
    fmt::print("TTFT          p50 {:.1f} ms, p99 {:.1f} ms\n", r.ttft_p50 * 1e3, r.ttft_p99 * 1e3);
    fmt::print("inter-token   p50 {:.1f} ms, p99 {:.1f} ms\n", r.itl_p50 * 1e3, r.itl_p99 * 1e3);
    if (r.server) {
      const serve::ServerMetrics& m = *r.server;
      const auto per_step = [&m](double seconds) {
        return m.peak_batch_steps > 0 ? 1e3 * seconds / m.peak_batch_steps : 0.0;
      };
      fmt::print("server        {} sequences at once at most, decode batch {} at most\n",
                 m.peak_running, m.peak_decode_batch);
      fmt::print(
          "decode steps  {} ({:.1f} sequences on average), {:.1f} tokens/s; at batch {}: {} "
          "steps, {:.1f} ms each ({:.1f} forward, {:.1f} eviction), {:.1f} tokens/s\n",
          m.decode_steps, m.mean_decode_batch(), m.decode_tokens_per_s(), m.peak_decode_batch,
          m.peak_batch_steps, per_step(m.peak_batch_seconds),
          per_step(m.peak_batch_forward_seconds), per_step(m.peak_batch_evict_seconds),
          m.peak_batch_tokens_per_s());
    }
  }
  return r.failed == 0 ? 0 : 1;
}

}  // namespace

void add_loadgen(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "loadgen",
      "Replay a seeded workload against `ekva serve`: throughput, TTFT, inter-token latency, and "
      "the server's concurrency and decode speed from its /metrics");
  auto o = std::make_shared<serve::LoadgenOptions>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("--url", o->url, "Server, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--requests", o->requests, "Requests in all")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "Requests in flight at once")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Random token ids per prompt")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens generated per request (EOS ignored)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the prompts and of each request's sampling")
      ->capture_default_str();
  cmd->add_option("--kv-policy", o->kv_policy, "Per-request KV policy (default: the server's)");
  cmd->add_option("--kv-budget", o->kv_budget, "Per-request KV budget (default: the server's)");
  cmd->add_option("--timeout", o->timeout_s,
                  "Seconds a request may wait for its response, its time in the queue included")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([&action, o, json] { action = [o, json] { return run_loadgen(*o, *json); }; });
}

}  // namespace ekva::cli
