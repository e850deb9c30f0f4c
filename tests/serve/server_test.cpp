// The HTTP server on loopback: concurrent plain and streamed completions give generate's tokens,
// bad requests get a 400 naming the field, a client that leaves mid-stream frees its pages, and
// /metrics is Prometheus text.
#include "serve/server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <sstream>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "serve/completion.h"
#include "serve/loadgen.h"
#include "support/repo_paths.h"

namespace ekva::serve {
namespace {

using nlohmann::json;

// A server on a free loopback port, serving on its own thread.
class ServerTest : public ::testing::Test {
 protected:
  // model: the one served (default the embedded model); with_tokenizer false: token ids only.
  void start(ServerOptions options = {}, const Model* model = nullptr, bool with_tokenizer = true) {
    options.model_name = "ekva-moe-8m";
    server_ = std::make_unique<Server>(model != nullptr ? *model : *model_,
                                       with_tokenizer ? tokenizer_.get() : nullptr, options);
    port_ = server_->bind("127.0.0.1", 0);
    serving_ = std::thread([this] { server_->run(); });
  }
  void SetUp() override {
    model_ = Model::load(testing::kEmbeddedModel);
    tokenizer_ = load_tokenizer(testing::kEmbeddedModel);
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (serving_.joinable()) serving_.join();
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(std::chrono::seconds(60));
    return c;
  }
  httplib::Result post(const std::string& body) const {
    return client()->Post("/v1/completions", body, "application/json");
  }
  // The token ids of a streamed completion and its last finish_reason.
  std::pair<std::vector<int32_t>, std::string> stream(const json& body) const {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = body.dump();
    std::string text;
    req.content_receiver = [&text](const char* data, size_t n, uint64_t, uint64_t) {
      text.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error error;
    EXPECT_TRUE(client()->send(req, res, error));
    EXPECT_EQ(res.status, 200);
    std::vector<int32_t> ids;
    std::string reason;
    std::istringstream lines(text);
    bool done = false;
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      EXPECT_TRUE(line.starts_with("data: ")) << line;
      if (line == "data: [DONE]") {
        done = true;
        continue;
      }
      const json chunk = json::parse(line.substr(6));
      for (const json& id : chunk["choices"][0]["token_ids"]) ids.push_back(id.get<int32_t>());
      if (!chunk["choices"][0]["finish_reason"].is_null())
        reason = chunk["choices"][0]["finish_reason"];
    }
    EXPECT_TRUE(done);
    return {ids, reason};
  }
  std::vector<int32_t> generated_alone(const std::vector<int32_t>& prompt, int max_tokens,
                                       float temperature, uint64_t seed,
                                       const PolicyOptions& policy) const {
    Engine engine(*model_, {}, policy);
    GenerateOptions g;
    g.max_new_tokens = max_tokens;
    g.sampling = SamplingOptions{temperature, 0, 1.0f, seed};
    return generate(engine, prompt, g).tokens;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> shape_;  // a model without weights, when one is served
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Server> server_;
  std::thread serving_;
  int port_ = 0;
};

TEST_F(ServerTest, ConcurrentPlainAndStreamedCompletionsGiveGeneratesTokens) {
  ServerOptions o;
  o.scheduler.max_sequences = 4;
  o.scheduler.prefill_chunk = 64;
  start(o);
  struct ClientCase {
    json body;
    std::vector<int32_t> prompt;
    PolicyOptions policy;
  };
  std::vector<ClientCase> cases;
  for (int i = 0; i < 6; ++i) {
    ClientCase c;
    for (int t = 0; t < 30 + 17 * i; ++t) c.prompt.push_back(5 + (t * 53 + i * 7) % 4000);
    c.body = {{"prompt", c.prompt},
              {"max_tokens", 8 + 3 * i},
              {"temperature", i % 3 == 0 ? 0.0 : 0.7},
              {"seed", 40 + i},
              {"stream", i % 2 == 1}};
    if (i >= 3) {
      c.policy.name = i == 3 ? "snapkv" : "ekva";
      c.policy.budget = 0.5;
      c.body["kv_policy"] = c.policy.name;
      c.body["kv_budget"] = 0.5;
    }
    cases.push_back(c);
  }
  // A text prompt, encoded as generate --prompt encodes it.
  ClientCase text;
  text.prompt = tokenizer_->encode("The cache keeps what matters", true);
  text.body = {{"prompt", "The cache keeps what matters"}, {"max_tokens", 10}, {"temperature", 0}};
  cases.push_back(text);

  std::vector<std::vector<int32_t>> got(cases.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < cases.size(); ++i) {
    clients.emplace_back([&, i] {
      if (cases[i].body.value("stream", false)) {
        got[i] = stream(cases[i].body).first;
        return;
      }
      const auto res = post(cases[i].body.dump());
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, 200) << res->body;
      const json j = json::parse(res->body);
      got[i] = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(j["usage"]["completion_tokens"], got[i].size());
      EXPECT_EQ(j["choices"][0]["text"],
                tokenizer_->decode(std::vector<int32_t>(got[i].begin(), got[i].end()), true));
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].body.dump());
    const json& b = cases[i].body;
    EXPECT_EQ(got[i],
              generated_alone(cases[i].prompt, b["max_tokens"], b.value("temperature", 1.0f),
                              b.value("seed", uint64_t{0}), cases[i].policy));
  }
  EXPECT_EQ(server_->stats().pages_in_use, 0);
}

// As `ekva serve --random-weights` runs: a model with its shape alone, whose backend brings its own
// weights (here the CPU backend over the embedded model's, on the GPU the random ones), and no
// tokenizer. Token ids are served as generate serves them; text gets a 400 naming the prompt.
TEST_F(ServerTest, AModelWithoutHostWeightsServesTokenIdsThroughItsBackend) {
  shape_ = Model::without_weights(model_->spec(), "config.json");
  const Model* shape = shape_.get();
  EXPECT_FALSE(shape->has_weights());
  EXPECT_TRUE(model_->has_weights());
  ServerOptions o;
  o.scheduler.max_sequences = 2;
  o.scheduler.backend = [this](const Model& served, const KvLayout& layout) {
    EXPECT_FALSE(served.has_weights());
    return std::make_unique<cpu::CpuBackend>(*model_, layout);
  };
  start(o, shape, false);
  const std::vector<int32_t> prompt = {1, 415, 1124, 77, 2051};
  const auto res = post(json({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}).dump());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            generated_alone(prompt, 6, 0.0f, 0, PolicyOptions{}));
  EXPECT_EQ(j["choices"][0]["text"], "");
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "Once upon a time"})", "prompt"},
           {R"({"prompt": [1, 2, 3], "stop": "x"})", "stop"}}) {
    const auto refused = post(body);
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 400);
    const json e = json::parse(refused->body);
    EXPECT_EQ(e["error"]["param"], field);
    if (field == "prompt") {
      EXPECT_NE(e["error"]["message"].get<std::string>().find("token ids"), std::string::npos);
    }
  }
}

TEST(ModelWithoutWeights, TheCpuBackendRefusesIt) {
  const auto shape =
      Model::without_weights(Model::load(testing::kEmbeddedModel)->spec(), "config.json");
  try {
    Engine engine(*shape);
    FAIL() << "the CPU backend ran a model without weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  EXPECT_EQ(shape->active_weight_bytes_per_token(), 0u);
}

TEST_F(ServerTest, EveryBadInputGetsA400NamingTheField) {
  ServerOptions o;
  start(o);
  const std::string long_prompt = json(std::vector<int>(4097, 7)).dump();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"prompt": [1, 2, 3], "max_tokens": )", "body"},
      {R"([1, 2, 3])", "body"},
      {R"({"max_tokens": 4})", "prompt"},
      {R"({"prompt": [1, 2, 3], "kv_policy": "no-such-policy"})", "kv_policy"},
      {R"({"prompt": [1, 2, 3], "kv_policy": 7})", "kv_policy"},
      {R"({"prompt": [1, 2, 3], "kv_policy": "snapkv", "kv_budget": 0})", "kv_budget"},
      {R"({"prompt": [1, 2, 3], "kv_policy": "snapkv", "kv_budget": -0.5})", "kv_budget"},
      {R"({"prompt": [1, 2, 3], "kv_budget": 1e9})", "kv_budget"},
      {R"({"prompt": )" + long_prompt + "}", "prompt"},
      {R"({"prompt": [1, 2, 3], "max_tokens": 4094})", "max_tokens"},
      {R"({"prompt": [1, 2, 3], "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": [1, 2, 3], "max_tokens": "8"})", "max_tokens"},
      {R"({"prompt": [1, 2, 99999]})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, 2, 3], "temperature": -1})", "temperature"},
      {R"({"prompt": [1, 2, 3], "top_p": 0})", "top_p"},
      {R"({"prompt": [1, 2, 3], "seed": -4})", "seed"},
      {R"({"prompt": [1, 2, 3], "stop": [""]})", "stop"},
      {R"({"prompt": [1, 2, 3], "stream": "yes"})", "stream"},
      {R"({"prompt": [1, 2, 3], "echo": true})", "echo"},
      {R"({"prompt": [1, 2, 3], "n": 2})", "n"},
      {R"({"prompt": [1, 2, 3], "model": "another-model"})", "model"},
  };
  for (const auto& [body, field] : cases) {
    SCOPED_TRACE(body.substr(0, 120));
    const auto res = post(body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400);
    const json j = json::parse(res->body, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << res->body;
    EXPECT_EQ(j["error"]["param"], field) << res->body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  const auto health = client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const auto missing = client()->Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(ServerTest, ARequestLargerThanTheKvMemoryIsRefusedAtOnce) {
  ServerOptions o;
  o.scheduler.kv_capacity_pages = 24 * 8;  // 8 pages per (layer, KV head): 128 tokens
  start(o);
  const auto fits = post(R"({"prompt": [1, 2, 3], "max_tokens": 4})");
  ASSERT_TRUE(fits);
  EXPECT_EQ(fits->status, 200);
  const auto res = post(R"({"prompt": [1, 2, 3], "max_tokens": 200})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "max_tokens");
}

TEST_F(ServerTest, AClientThatLeavesMidStreamFreesItsPages) {
  start();
  const json body = {{"prompt", std::vector<int>(64, 9)},
                     {"max_tokens", 4000},
                     {"ignore_eos", true},
                     {"stream", true}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  int chunks = 0;
  req.content_receiver = [&chunks](const char*, size_t, uint64_t, uint64_t) {
    return ++chunks < 3;  // false: the client hangs up
  };
  httplib::Response res;
  httplib::Error error;
  {
    auto c = client();
    c->send(req, res, error);
    EXPECT_TRUE(server_->stats().pages_in_use > 0 || server_->stats().cancelled == 1);
  }  // the client and its connection are gone
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (server_->stats().cancelled == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const SchedulerStats s = server_->stats();
  EXPECT_EQ(s.cancelled, 1u);
  EXPECT_EQ(s.finished, 0u);
  EXPECT_EQ(s.pages_in_use, 0);
  EXPECT_EQ(s.pages_reserved, 0);
  EXPECT_LT(s.generated_tokens, 4000u);
}

TEST_F(ServerTest, StopStringsEndTheTextBeforeThem) {
  start();
  const auto free_run =
      post(R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0})");
  ASSERT_TRUE(free_run);
  const std::string text = json::parse(free_run->body)["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 3);
  const auto res = post(
      json({{"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}, {"stop", stop}})
          .dump());
  ASSERT_TRUE(res);
  const json j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["text"], text.substr(0, text.find(stop)));
}

TEST_F(ServerTest, MetricsAreParsablePrometheusText) {
  start();
  ASSERT_TRUE(post(R"({"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": true})"));
  ASSERT_TRUE(post(R"({"prompt": 5})"));  // rejected
  const auto res = client()->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*) (-?[0-9.eE+-]+|NaN|[+-]Inf))");
  const std::regex comment(R"(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+)");
  std::map<std::string, double> values;
  std::istringstream lines(res->body);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, comment)) continue;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << line;
    values[m[1]] = std::stod(m[2]);
  }
  for (const char* name : {"ekva_requests_admitted_total",
                           "ekva_requests_finished_total",
                           "ekva_requests_rejected_total",
                           "ekva_prompt_tokens_total",
                           "ekva_generated_tokens_total",
                           "ekva_kv_pages_in_use",
                           "ekva_kv_pages_free",
                           "ekva_queue_length",
                           "ekva_decode_batch_size",
                           "ekva_step_seconds_total",
                           "ekva_running_sequences",
                           "ekva_kv_page_bytes",
                           "ekva_running_sequences_peak",
                           "ekva_decode_batch_size_peak",
                           "ekva_decode_steps_total",
                           "ekva_decode_tokens_total",
                           "ekva_decode_seconds_total",
                           "ekva_decode_peak_batch_steps",
                           "ekva_decode_peak_batch_seconds",
                           "ekva_decode_peak_batch_forward_seconds",
                           "ekva_decode_peak_batch_evict_seconds"}) {
    EXPECT_TRUE(values.contains(name)) << name;
  }
  EXPECT_EQ(values, parse_metrics(res->body));       // loadgen's reader agrees
  EXPECT_EQ(values["ekva_decode_tokens_total"], 4);  // the first token comes from the prefill
  EXPECT_EQ(values["ekva_running_sequences_peak"], 1);
  EXPECT_EQ(values["ekva_decode_batch_size_peak"], 1);
  EXPECT_EQ(values["ekva_kv_page_bytes"], 2 * 16 * 32 * 4);  // f32 K and V, head_dim 32
  EXPECT_EQ(values["ekva_generated_tokens_total"], 5);
  EXPECT_EQ(values["ekva_prompt_tokens_total"], 3);
  EXPECT_EQ(values["ekva_requests_rejected_total"], 1);
  EXPECT_EQ(values["ekva_kv_pages_in_use"] + values["ekva_kv_pages_free"],
            values["ekva_kv_pages_capacity"]);
}

TEST_F(ServerTest, LoadgenReplaysAWorkloadAndMeasuresIt) {
  start();
  LoadgenOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(port_);
  o.requests = 6;
  o.concurrency = 3;
  o.prompt_tokens = 20;
  o.max_tokens = 5;
  const LoadgenResult r = run_loadgen(o);
  EXPECT_EQ(r.completed, 6);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.output_tokens, 30);
  EXPECT_GT(r.output_tokens_per_s, 0.0);
  EXPECT_GT(r.ttft_p50, 0.0);
  EXPECT_LE(r.ttft_p50, r.ttft_p99);
  EXPECT_LE(r.itl_p50, r.itl_p99);
  // What the server saw: at most 3 requests at once, every token after each first one decoded.
  ASSERT_TRUE(r.server.has_value());
  EXPECT_GE(r.server->peak_running, 1);
  EXPECT_LE(r.server->peak_running, 3);
  EXPECT_GE(r.server->peak_decode_batch, 1);
  EXPECT_LE(r.server->peak_decode_batch, r.server->peak_running);
  EXPECT_EQ(r.server->decode_tokens, 6 * 4);
  EXPECT_GT(r.server->decode_tokens_per_s(), 0.0);
  EXPECT_GT(r.server->peak_batch_tokens_per_s(), 0.0);
  EXPECT_GT(r.server->kv_capacity_pages, 0);
  EXPECT_EQ(r.server->kv_page_bytes, 2 * 16 * 32 * 4);
}

TEST(ParseMetrics, ReadsSamplesAndSkipsTheRest) {
  const auto values = parse_metrics(
      "# HELP a_total A.\n# TYPE a_total counter\na_total 3\nb 2.5e-3\nlabelled{x=\"1\"} 4\n"
      "broken\nc not-a-number\nd +Inf");
  EXPECT_EQ(values.size(), 3u);
  EXPECT_EQ(values.at("a_total"), 3);
  EXPECT_EQ(values.at("b"), 2.5e-3);
  EXPECT_TRUE(std::isinf(values.at("d")));
}

TEST(Percentile, IsTheNearestRank) {
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_EQ(percentile({3, 1, 2}, 50), 2.0);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 50), 2.0);
  EXPECT_EQ(percentile({1, 2, 3, 4}, 99), 4.0);
  EXPECT_EQ(percentile({5}, 0), 5.0);
}

TEST(CompletionText, HoldsBackWhatCouldStartAStopString) {
  const auto tokenizer = load_tokenizer(testing::kEmbeddedModel);
  const std::vector<int32_t> ids = tokenizer->encode("one two three four", false);
  CompletionText text(tokenizer.get(), {"three"});
  std::string sent;
  bool go_on = true;
  for (size_t i = 0; i < ids.size() && go_on; ++i) {
    go_on = text.add(ids[i]);
    sent += text.take_ready(!go_on);
  }
  EXPECT_FALSE(go_on);
  EXPECT_EQ(sent, "one two ");
}

}  // namespace
}  // namespace ekva::serve
