// Continuous batching without HTTP: the same tokens as generate, admission by KV pages that never
// overcommits, cancellation that frees pages at once.
#include "serve/scheduler.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "roofline/serving.h"
#include "support/pages_off_host.h"
#include "support/repo_paths.h"

namespace ekva::serve {
namespace {

// For the whole test binary (the server's worker inherits it): the embedded model's steps are too
// small to share, and when ctest runs binaries side by side a team of spinning threads waits at
// every barrier for a preempted one, which made these tests 3-4x slower under the sanitizers.
[[maybe_unused]] const bool kOneOpenMpThread = [] {
  omp_set_num_threads(1);
  return true;
}();

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 3 + (i * 37 + salt * 101) % 4000;
  return p;
}

PolicyOptions policy_named(const std::string& name, std::optional<double> budget) {
  PolicyOptions o;
  o.name = name;
  o.budget = budget;
  return o;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::optional<FinishReason> reason;
};

// Submits with callbacks that record into `out`.
uint64_t submit(Scheduler& s, GenerationRequest r, Outcome& out) {
  r.on_token = [&out](int32_t t) {
    out.tokens.push_back(t);
    return true;
  };
  r.on_finish = [&out](FinishReason reason, const std::string&) { out.reason = reason; };
  return s.submit(std::move(r));
}

void run_until_idle(Scheduler& s, int max_steps = 10000) {
  for (int i = 0; i < max_steps && !s.idle(); ++i) s.step();
  ASSERT_TRUE(s.idle());
}

std::vector<int32_t> generated_alone(const Model& model, const GenerationRequest& r,
                                     const PolicyOptions& policy) {
  Engine engine(model, {}, policy);
  GenerateOptions g;
  g.max_new_tokens = r.max_tokens;
  g.sampling = r.sampling;
  g.stop_at_eos = r.stop_at_eos;
  return generate(engine, r.prompt, g).tokens;
}

struct Case {
  std::string policy;
  std::optional<double> budget;
  int prefill_chunk;
  bool prefill_first = false;
};

class SameTokensAsGenerate : public ::testing::TestWithParam<Case> {};

// Requests of different lengths, seeds, temperatures and (per request) policies run side by side,
// joining and leaving the batch at different steps; each gives what generate gives alone.
TEST_P(SameTokensAsGenerate, ForEveryRequestOfABatch) {
  const auto model = Model::load(testing::kEmbeddedModel);
  SchedulerOptions o;
  o.max_sequences = 3;
  o.prefill_chunk = GetParam().prefill_chunk;
  o.prefill_first = GetParam().prefill_first;
  o.policy.name = GetParam().policy;
  o.policy.budget = GetParam().budget;
  Scheduler s(*model, o);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r;
    r.prompt = prompt_of(24 + 15 * i, i);
    r.max_tokens = 4 + 2 * i;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    r.sampling.top_p = i == 3 ? 0.9f : 1.0f;
    r.sampling.seed = 1000 + i;
    if (i == 4) r.policy = policy_named("h2o", 24.0);
    requests.push_back(r);
  }
  std::vector<Outcome> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) submit(s, requests[i], out[i]);
  run_until_idle(s);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    const PolicyOptions policy = requests[i].policy ? *requests[i].policy : o.policy;
    EXPECT_EQ(out[i].tokens, generated_alone(*model, requests[i], policy));
    ASSERT_TRUE(out[i].reason.has_value());
    EXPECT_NE(*out[i].reason, FinishReason::kError);
  }
  EXPECT_EQ(s.stats().pages_in_use, 0);
  EXPECT_EQ(s.stats().pages_reserved, 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, SameTokensAsGenerate,
                         ::testing::Values(Case{"full", std::nullopt, 1024},
                                           Case{"snapkv", 0.5, 1024}, Case{"ekva", 0.3, 1024},
                                           Case{"keydiff", 0.3, 1024}, Case{"snapkv", 0.5, 32},
                                           Case{"ekva", 0.3, 32, true}),
                         [](const auto& test) {
                           return test.param.policy + "_chunk" +
                                  std::to_string(test.param.prefill_chunk) +
                                  (test.param.prefill_first ? "_prefill_first" : "");
                         });

// Prefill first: every prompt the memory admits is prefilled before the batch decodes, so the
// decode batch is what the KV memory holds, the count the Roofline's serving prediction makes
// (predict_serving models this admission rule); the decode counters see every step.
TEST(SchedulerPrefillFirst, TheBatchIsWhatTheMemoryHoldsAsTheServingPredictionSays) {
  const auto model = Model::load(testing::kEmbeddedModel);
  const ModelSpec& spec = model->spec();
  constexpr int kPrompt = 96, kTokens = 6, kRequests = 24;
  for (const double budget : {1.0, 0.5, 0.25}) {
    SCOPED_TRACE(budget);
    SchedulerOptions o;
    o.max_sequences = kRequests;
    o.prefill_chunk = 32;
    o.prefill_first = true;
    o.policy = policy_named(budget < 1 ? "snapkv" : "full", budget);
    Scheduler probe(*model, o);
    o.kv_capacity_pages = 3 * probe.pages_to_admit(kPrompt, kTokens) + 11;
    Scheduler s(*model, o);
    std::vector<Outcome> out(kRequests);
    for (int i = 0; i < kRequests; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(kPrompt, i);
      r.max_tokens = kTokens;
      r.stop_at_eos = false;
      submit(s, r, out[i]);
    }
    run_until_idle(s);
    ServingConfig c;
    c.kv_memory_bytes = static_cast<double>(o.kv_capacity_pages * s.stats().page_bytes);
    c.prompt_tokens = kPrompt;
    c.max_tokens = kTokens;
    c.budget = budget;
    c.page_size = o.kv.page_size;
    c.base.kv_format = NumberFormat::kF32;  // the CPU engine's K and V
    const ServingPrediction predicted = predict_serving(spec, find_hardware("h200"), c);
    const SchedulerStats st = s.stats();
    EXPECT_EQ(predicted.capacity_pages, o.kv_capacity_pages);
    EXPECT_EQ(predicted.admit_pages, s.pages_to_admit(kPrompt, kTokens));
    EXPECT_GE(predicted.sequences, budget < 1 ? 4 : 3);
    EXPECT_LT(predicted.sequences, kRequests);
    EXPECT_EQ(st.peak_running, predicted.sequences);
    EXPECT_EQ(st.peak_decode_batch, predicted.sequences);
    // Every token but each request's first (sampled after its prefill) comes from a decode step;
    // the first wave decodes its kTokens - 1 steps together at the peak.
    EXPECT_EQ(st.decode_tokens, static_cast<uint64_t>(kRequests * (kTokens - 1)));
    EXPECT_GE(st.peak_batch_steps, static_cast<uint64_t>(kTokens - 1));
    EXPECT_GT(st.decode_seconds, 0.0);
    EXPECT_GT(st.peak_batch_seconds, 0.0);
    EXPECT_LE(st.peak_batch_seconds, st.decode_seconds);
    EXPECT_GT(st.peak_batch_forward_seconds, 0.0);
    EXPECT_GE(st.peak_batch_evict_seconds, 0.0);
    EXPECT_LE(st.peak_batch_forward_seconds + st.peak_batch_evict_seconds, st.peak_batch_seconds);
    for (const Outcome& x : out) EXPECT_EQ(x.tokens.size(), static_cast<size_t>(kTokens));
  }
}

// Pages in use never exceed the capacity nor what admitted requests reserved, while requests wait
// for pages (not for sequences) and all of them still complete.
TEST(SchedulerAdmission, NeverLetsPagesInUseExceedTheCapacity) {
  const auto model = Model::load(testing::kEmbeddedModel);
  for (const char* policy : {"full", "snapkv", "ekva"}) {
    SCOPED_TRACE(policy);
    SchedulerOptions o;
    o.max_sequences = 8;
    o.prefill_chunk = 48;
    o.policy.name = policy;
    o.policy.budget = 0.25;
    Scheduler probe(*model, o);
    // Room for two requests' full prompts and tokens, not for six.
    o.kv_capacity_pages = 2 * probe.pages_to_admit(96, 8) + 10;
    Scheduler s(*model, o);
    std::vector<Outcome> out(6);
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(48 + 16 * (i % 4), i);
      r.max_tokens = 8;
      r.stop_at_eos = false;
      submit(s, r, out[i]);
    }
    int most_running = 0;
    bool waited_for_pages = false;
    for (int step = 0; step < 10000 && !s.idle(); ++step) {
      s.step();
      const SchedulerStats st = s.stats();
      ASSERT_LE(st.pages_in_use, st.capacity_pages);
      ASSERT_LE(st.pages_in_use, st.pages_reserved);
      ASSERT_LE(st.pages_reserved, st.capacity_pages);
      most_running = std::max(most_running, st.running);
      waited_for_pages = waited_for_pages || (st.queued > 0 && st.running < o.max_sequences);
    }
    ASSERT_TRUE(s.idle());
    EXPECT_TRUE(waited_for_pages);
    EXPECT_GE(most_running, 2);
    for (const Outcome& x : out) {
      EXPECT_EQ(x.reason, FinishReason::kLength);
      EXPECT_EQ(x.tokens.size(), 8u);
    }
    EXPECT_EQ(s.stats().pages_in_use, 0);
  }
}

// A budget is room: after compression a request reserves only what its policy keeps, so the same
// pages run more sequences at once than with the full cache.
TEST(SchedulerAdmission, ABudgetRunsMoreSequencesInTheSamePages) {
  const auto model = Model::load(testing::kEmbeddedModel);
  std::map<std::string, int> most_running;
  for (const char* policy : {"full", "snapkv"}) {
    SchedulerOptions o;
    o.max_sequences = 8;
    o.prefill_chunk = 256;
    o.policy.name = policy;
    o.policy.budget = 0.2;
    Scheduler probe(*model, o);
    o.kv_capacity_pages = 3 * probe.pages_to_admit(128, 8);
    Scheduler s(*model, o);
    std::vector<Outcome> out(6);
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(128, i);
      r.max_tokens = 8;
      r.stop_at_eos = false;
      submit(s, r, out[i]);
    }
    for (int step = 0; step < 10000 && !s.idle(); ++step) {
      s.step();
      most_running[policy] = std::max(most_running[policy], s.stats().running);
    }
  }
  EXPECT_LE(most_running["full"], 3);
  EXPECT_GT(most_running["snapkv"], most_running["full"]);
}

TEST(SchedulerAdmission, RefusesARequestThatCanNeverFitAtOnce) {
  const auto model = Model::load(testing::kEmbeddedModel);
  SchedulerOptions o;
  Scheduler probe(*model, o);
  o.kv_capacity_pages = probe.pages_to_admit(64, 8);
  Scheduler s(*model, o);
  GenerationRequest fits;
  fits.prompt = prompt_of(64, 0);
  fits.max_tokens = 8;
  EXPECT_NO_THROW(s.submit(fits));
  GenerationRequest too_long = fits;
  too_long.prompt = prompt_of(200, 0);
  try {
    s.submit(too_long);
    FAIL() << "a request larger than the capacity was queued";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
  }
  EXPECT_EQ(s.stats().queued, 1);
}

TEST(SchedulerCancel, FreesTheRequestsPagesAtOnce) {
  const auto model = Model::load(testing::kEmbeddedModel);
  SchedulerOptions o;
  o.max_sequences = 2;
  Scheduler s(*model, o);
  GenerationRequest r;
  r.prompt = prompt_of(80, 1);
  r.max_tokens = 200;
  r.stop_at_eos = false;
  Outcome running, queued, other;
  const uint64_t a = submit(s, r, running);
  submit(s, r, other);
  const uint64_t c = submit(s, r, queued);  // waits: two sequences only
  for (int i = 0; i < 5; ++i) s.step();
  ASSERT_GT(s.stats().pages_in_use, 0);
  ASSERT_EQ(s.stats().queued, 1);
  const int64_t both = s.stats().pages_in_use;
  EXPECT_TRUE(s.cancel(a));
  EXPECT_EQ(running.reason, FinishReason::kCancelled);
  EXPECT_EQ(s.stats().pages_in_use, both / 2);  // two requests of the same size, one left
  EXPECT_TRUE(s.cancel(c));
  EXPECT_EQ(queued.reason, FinishReason::kCancelled);
  EXPECT_TRUE(queued.tokens.empty());
  EXPECT_FALSE(s.cancel(a));
  s.cancel_all();
  EXPECT_EQ(other.reason, FinishReason::kCancelled);
  EXPECT_EQ(s.stats().pages_in_use, 0);
  EXPECT_EQ(s.stats().pages_reserved, 0);
  EXPECT_TRUE(s.idle());
}

TEST(SchedulerStop, ATokenCallbackThatSaysStopEndsTheRequest) {
  const auto model = Model::load(testing::kEmbeddedModel);
  Scheduler s(*model, {});
  GenerationRequest r;
  r.prompt = prompt_of(30, 2);
  r.max_tokens = 50;
  r.stop_at_eos = false;
  std::vector<int32_t> tokens;
  std::optional<FinishReason> reason;
  r.on_token = [&tokens](int32_t t) {
    tokens.push_back(t);
    return tokens.size() < 3;
  };
  r.on_finish = [&reason](FinishReason f, const std::string&) { reason = f; };
  s.submit(r);
  run_until_idle(s);
  EXPECT_EQ(tokens.size(), 3u);
  EXPECT_EQ(reason, FinishReason::kStop);
}

TEST(SchedulerSubmit, RefusesBadRequests) {
  const auto model = Model::load(testing::kEmbeddedModel);
  Scheduler s(*model, {});
  GenerationRequest r;
  EXPECT_THROW(s.submit(r), Error);  // empty prompt
  r.prompt = {1, 2, model->spec().vocab_size};
  EXPECT_THROW(s.submit(r), Error);
  r.prompt = {1, 2, 3};
  r.max_tokens = 0;
  EXPECT_THROW(s.submit(r), Error);
  r.max_tokens = 4;
  r.policy = policy_named("no-such-policy", std::nullopt);
  EXPECT_THROW(s.submit(r), Error);
  EXPECT_TRUE(s.idle());
}

// Where the keys stay on the device, keydiff is refused up front, as the default policy and per
// request, rather than when the request's prompt is compressed.
TEST(SchedulerSubmit, RefusesKeyDiffWhereTheKeysAreNotOnTheHost) {
  const auto model = Model::load(testing::kEmbeddedModel);
  SchedulerOptions o;
  o.backend = testing::pages_off_host();
  o.device = "cuda";
  o.policy = policy_named("keydiff", 0.25);
  EXPECT_THROW(Scheduler(*model, o), Error);
  o.policy = policy_named("snapkv", 0.25);
  Scheduler s(*model, o);
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.policy = policy_named("keydiff", 0.25);
  try {
    s.submit(r);
    ADD_FAILURE() << "keydiff was queued";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'keydiff'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.check_policy(*r.policy), Error);
  EXPECT_TRUE(s.idle());
}

}  // namespace
}  // namespace ekva::serve
