#include "kv/policy.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "engine/generate.h"
#include "support/host_kv.h"
#include "support/param_name.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

const std::string kMixtral = std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-mixtral";
const std::string kQwen2 = std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-qwen2_moe";

std::vector<int32_t> prompt_of(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 3 + (i * 37) % 200;
  return p;
}

// Prefills `prompt` into sequence 0 with the policy's scoring, then compresses.
void prefill(Engine& engine, const std::vector<int32_t>& prompt) {
  engine.prefill(0, prompt);
  engine.compress(0, static_cast<int>(prompt.size()));
}

class EveryPolicy : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryPolicy, KeepsExactlyItsBudgetAfterPrefillAndDuringDecode) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  PolicyOptions o;
  o.name = GetParam();
  o.budget = 0.25;
  Engine engine(*model, {}, o);
  const KvPolicy& policy = *engine.policy();
  const KvLayout& cache = engine.layout();
  const auto prompt = prompt_of(200);
  prefill(engine, prompt);
  std::vector<std::set<int32_t>> evicted(s.num_layers * s.num_kv_heads);
  auto check = [&](int total) {
    int budget_sum = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const HeadTable& t = cache.table(0, l, h);
        const int want =
            GetParam() == "full" ? total : std::min(total, policy.head_budget(0, l, h));
        EXPECT_EQ(t.size(), want) << "layer " << l << " head " << h;
        budget_sum += t.size();
        std::set<int32_t> kept;
        for (const TokenMeta& mt : t.meta) kept.insert(mt.position);
        for (int32_t p : evicted[l * s.num_kv_heads + h])
          EXPECT_EQ(kept.count(p), 0u) << "position " << p << " came back";
        for (int32_t p = 0; p < total; ++p) {
          if (!kept.count(p)) evicted[l * s.num_kv_heads + h].insert(p);
        }
      }
    }
    if (GetParam() != "full") {
      EXPECT_EQ(budget_sum, 50 * s.num_layers * s.num_kv_heads);  // mean 0.25 x 200
    }                                                             // mean 0.25 x 200
  };
  check(200);
  for (int step = 0; step < 40; ++step) {
    engine.decode(0, 5 + step);
    check(201 + step);
  }
}

INSTANTIATE_TEST_SUITE_P(Kv, EveryPolicy, ::testing::ValuesIn(KvPolicy::names()),
                         ekva::testing::param_name);

TEST(Policy, FullReproducesTheUncompressedLogits) {
  const auto model = Model::load(kMixtral);
  const auto prompt = prompt_of(60);
  GenerateOptions g;
  g.max_new_tokens = 20;
  g.stop_at_eos = false;
  Engine a(*model), b(*model, {}, PolicyOptions{});
  EXPECT_EQ(generate(a, prompt, g).tokens, generate(b, prompt, g).tokens);
  // Scoring never changes what attention computes.
  ForwardBatch plain, scored;
  for (int i = 0; i < 60; ++i) plain.add(prompt[i], 0, i), scored.add(prompt[i], 0, i);
  scored.score_query.assign(60, 1);
  EXPECT_EQ(Engine(*model).step(plain), Engine(*model).step(scored));
}

TEST(Policy, EkvaFillsEachGroupQuotaFromItsOwnTokens) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  PolicyOptions o;
  o.name = "ekva-quota";
  o.budget = 0.5;
  o.window = 4;
  Engine engine(*model, {}, o);
  const KvLayout& cache = engine.layout();
  const int n = 240;
  const auto prompt = prompt_of(n);
  engine.prefill(0, prompt);
  auto per_expert = [&](int l, int h) {
    std::vector<int> count(s.num_experts, 0);
    for (const TokenMeta& m : cache.table(0, l, h).meta) {
      if (m.position < n - o.window) ++count[m.expert];
    }
    return count;
  };
  std::vector<std::vector<int>> available;
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) available.push_back(per_expert(l, h));
  }
  engine.compress(0, n);
  // Uniform quotas: (120 - 4 window) tokens over 6 experts = 19 or 20 each (largest remainder).
  // Every group keeps its quota when it has that many tokens, all of them otherwise.
  const std::vector<int> quota = {20, 20, 19, 19, 19, 19};
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const std::vector<int> kept = per_expert(l, h);
      int total = 0;
      for (int e = 0; e < s.num_experts; ++e) {
        EXPECT_GE(kept[e], std::min(quota[e], available[l * s.num_kv_heads + h][e]))
            << l << "/" << h << "/" << e;
        EXPECT_LE(kept[e], available[l * s.num_kv_heads + h][e]);
        total += kept[e];
      }
      EXPECT_EQ(total, 116);
    }
  }
}

// ekva keeps its surprisal outliers first and holds them through decode; with no outliers (a
// threshold no token reaches) it is exactly Ada-KV.
TEST(Policy, EkvaPinsItsSurprisalReserveOnAdaKvBudgets) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  const int n = 240;
  std::vector<int32_t> prompt(n, 7);  // one token repeated, with two rare ones in the middle
  prompt[60] = 150;
  prompt[61] = 151;
  PolicyOptions o;
  o.name = "rarity-tokens";
  o.budget = 0.2;
  o.reserve.threshold = 3.0;
  Engine engine(*model, {}, o);
  engine.prefill(0, prompt);
  engine.compress(0, n);
  for (int step = 0; step < 20; ++step) engine.decode(0, 7);
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      std::set<int32_t> kept;
      for (const TokenMeta& m : engine.layout().table(0, l, h).meta) kept.insert(m.position);
      EXPECT_TRUE(kept.count(60) && kept.count(61)) << "layer " << l << " head " << h;
    }
  }
  // A threshold nothing exceeds: the same retained set as Ada-KV.
  std::vector<std::set<int32_t>> retained[2];
  for (int i = 0; i < 2; ++i) {
    PolicyOptions p;
    p.name = i == 0 ? "adakv" : "ekva";
    p.budget = 0.2;
    p.reserve.threshold = 1e9;
    Engine e(*model, {}, p);
    e.prefill(0, prompt_of(n));
    e.compress(0, n);
    for (int step = 0; step < 10; ++step) e.decode(0, 5 + step);
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        std::set<int32_t> kept;
        for (const TokenMeta& m : e.layout().table(0, l, h).meta) kept.insert(m.position);
        retained[i].push_back(kept);
      }
    }
  }
  EXPECT_EQ(retained[0], retained[1]);
}

ModelSpec one_head(int head_dim) {
  ModelSpec s;
  s.num_layers = 1;
  s.num_kv_heads = 1;
  s.num_heads = 1;
  s.head_dim = head_dim;
  s.max_position = 64;
  return s;
}

std::set<int32_t> positions(const HeadTable& t) {
  std::set<int32_t> kept;
  for (const TokenMeta& m : t.meta) kept.insert(m.position);
  return kept;
}

// Keys worked out by hand (head dimension 2, pages of 2, so slots span pages). Unit keys (1, 0),
// (1, 0), (0, 1) sum to the anchor (2, 1); the zero key adds nothing. A key's length does not
// count, only its direction: (2, 0) scores as (1, 0). With the raw mean (3, 3) / 4 as the anchor,
// (1, 0) and (0, 3) would tie; the paper's unit-key anchor ranks (0, 3) as the more distinct.
TEST(KeyDistinctness, NegativeCosineToTheMeanOfTheUnitKeys) {
  testing::HostKv cache(one_head(2), 1, /*page_size=*/2);
  const std::vector<std::vector<float>> keys = {{1, 0}, {2, 0}, {0, 3}, {0, 0}};
  for (size_t p = 0; p < keys.size(); ++p) {
    TokenMeta m;
    m.position = static_cast<int32_t>(p);
    m.score = 9.0f;  // attention scores are replaced, not added to
    cache.append(0, 0, 0, keys[p].data(), keys[p].data(), m);
  }
  HeadTable& t = cache.table(0, 0, 0);
  score_key_distinctness(t, cache.pages);
  EXPECT_NEAR(t.meta[0].score, -2 / std::sqrt(5.0), 1e-6);
  EXPECT_NEAR(t.meta[1].score, -2 / std::sqrt(5.0), 1e-6);
  EXPECT_NEAR(t.meta[2].score, -1 / std::sqrt(5.0), 1e-6);
  EXPECT_EQ(t.meta[3].score, 0.0f);
  // Keys that cancel leave no anchor direction: every key scores 0.
  testing::HostKv opposite(one_head(2), 1, 2);
  const float right[] = {1, 0}, left[] = {-3, 0};
  opposite.append(0, 0, 0, right, right, TokenMeta{0, -1, 5.0f});
  opposite.append(0, 0, 0, left, left, TokenMeta{1, -1, 5.0f});
  score_key_distinctness(opposite.table(0, 0, 0), opposite.pages);
  EXPECT_EQ(opposite.table(0, 0, 0).meta[0].score, 0.0f);
  EXPECT_EQ(opposite.table(0, 0, 0).meta[1].score, 0.0f);
}

// keydiff through the policy framework on keys worked out by hand: a budget of 4 tokens per head,
// a window of 1. After the prompt, unit-key anchor ~(4.99, 1.05) (11.9 degrees): besides the window
// (position 7) it keeps (-1, 0), (0, 1) and (1, -0.1) (17.6 degrees off). A decode step appends
// (0, -1); the anchor is then the mean over what is retained, ~(0.995, -0.0995): (1, -0.1) now lies
// on it and goes, while (1, 0) (5.7 degrees off) stays.
TEST(Policy, KeyDiffKeepsTheMostDistinctKeysAndReranksAtEveryDecodeStep) {
  testing::HostKv cache(one_head(2), 1, 2);
  const std::vector<std::vector<float>> keys = {{1, 0},     {1, 0.1f}, {1, -0.1f}, {0, 1},
                                                {1, 0.05f}, {-1, 0},   {1, 0},     {1, 0}};
  const int n = static_cast<int>(keys.size());
  for (int p = 0; p < n; ++p) cache.append(0, 0, 0, keys[p].data(), keys[p].data(), TokenMeta{p});
  cache.layout.advance(0, n);
  PolicyOptions o;
  o.name = "keydiff";
  o.budget = 4;
  o.window = 1;
  KvPolicy policy(o, one_head(2));
  EXPECT_TRUE(policy.ranks_keys());
  EXPECT_FALSE(policy.scores_decode());  // query-agnostic: no attention feeds its scores
  EXPECT_EQ(policy.prefill_score_queries(n), std::vector<uint8_t>(n, 0));
  policy.score_keys(cache.layout, cache.pages, 0);
  const EvictionPlan compressed = policy.compress(cache.layout, 0, n);
  EXPECT_EQ(compressed.pool_kernel, 1);  // a key's distinctness is its own, not its neighbours'
  apply_on_host(compressed, cache.layout, cache.pages);
  EXPECT_EQ(positions(cache.table(0, 0, 0)), (std::set<int32_t>{2, 3, 5, 7}));

  const float down[] = {0, -1};
  cache.append(0, 0, 0, down, down, TokenMeta{n});
  cache.layout.advance(0, 1);
  policy.score_keys(cache.layout, cache.pages, 0);
  apply_on_host(policy.evict(cache.layout, 0), cache.layout, cache.pages);
  EXPECT_EQ(positions(cache.table(0, 0, 0)), (std::set<int32_t>{3, 5, 7, 8}));
}

// What keydiff keeps of one head: the recent window, then the highest key distinctness (earlier
// position on a tie), scored on the table as it stands.
std::set<int32_t> keydiff_reference(HeadTable t, const KvPages& pages, int keep, int32_t end,
                                    int window) {
  score_key_distinctness(t, pages);
  std::vector<TokenMeta> rest;
  std::set<int32_t> kept;
  for (const TokenMeta& m : t.meta) {
    if (m.position >= end - window) {
      kept.insert(m.position);
    } else {
      rest.push_back(m);
    }
  }
  std::sort(rest.begin(), rest.end(), [](const TokenMeta& a, const TokenMeta& b) {
    return a.score > b.score || (a.score == b.score && a.position < b.position);
  });
  for (size_t i = 0; i < rest.size() && static_cast<int>(kept.size()) < keep; ++i)
    kept.insert(rest[i].position);
  return kept;
}

// The engine scores keydiff's keys from its host pages before compressing and before each decode
// step's eviction (without that, every score is 0 and the earliest positions would stay).
TEST(Policy, TheEngineRanksKeyDiffByTheCachedKeys) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  PolicyOptions o;
  o.name = "keydiff";
  o.budget = 0.25;
  Engine engine(*model, {}, o);
  const int n = 200, keep = 50;
  engine.prefill(0, prompt_of(n));
  auto expect_reference = [&](Engine& before, int32_t end) {
    const KvPages& pages = *before.backend().host_pages();
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        EXPECT_EQ(positions(engine.layout().table(0, l, h)),
                  keydiff_reference(before.layout().table(0, l, h), pages, keep, end, o.window))
            << "layer " << l << " head " << h << " at position " << end;
      }
    }
  };
  {
    Engine before = engine;
    engine.compress(0, n);
    expect_reference(before, n);
  }
  for (int step = 0; step < 3; ++step) {
    Engine before = engine;  // the step's token appended, not yet evicted
    ForwardBatch batch;
    batch.add(11 + step, 0, before.layout().next_position(0));
    before.step(batch);
    engine.decode(0, 11 + step);
    expect_reference(before, n + step + 1);
  }
}

TEST(Policy, RejectsUnknownNamesBadBudgetsAndForeignPlans) {
  const auto model = Model::load(kMixtral);
  PolicyOptions o;
  o.name = "nope";
  EXPECT_THROW(KvPolicy(o, model->spec()), Error);
  o.name = "h2o";
  o.budget = -1;
  EXPECT_THROW(KvPolicy(o, model->spec()), Error);
  const auto other = Model::load(kQwen2);
  o.budget = 0.5;
  o.name = "ekva";
  o.plan = BudgetPlan::uniform(other->spec(), other->spec().num_experts,
                               BudgetPlan::Unit::kFraction, 0.5);
  EXPECT_THROW(KvPolicy(o, model->spec()), Error);
}

TEST(BudgetPlanFile, RoundTripsAndRejectsBadFiles) {
  const auto model = Model::load(kMixtral);
  const ModelSpec& s = model->spec();
  BudgetPlan plan = BudgetPlan::uniform(s, 2, BudgetPlan::Unit::kTokens, 64);
  plan.set_budget(1, 1, 0, 10);
  plan.set_expert_group(2, 3, 0);
  const fs::path p =
      fs::temp_directory_path() / ("ekva_plan_" + std::to_string(::getpid()) + ".json");
  plan.save(p);
  const BudgetPlan back = BudgetPlan::load(p);
  EXPECT_EQ(back.to_json(), plan.to_json());
  EXPECT_DOUBLE_EQ(back.retained_tokens(1, 1, 1000), 42.0);
  EXPECT_EQ(back.group_of(2, 3), 0);
  EXPECT_NO_THROW(back.check_model(s));

  auto expect_error = [&](const std::function<void(nlohmann::json&)>& edit,
                          const std::string& needle) {
    nlohmann::json j = plan.to_json();
    edit(j);
    try {
      BudgetPlan::from_json(j, "plan.json");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([](auto& j) { j["budgets"][0][0][0] = -3; }, "must be >= 0");
  expect_error([](auto& j) { j["budgets"].push_back(j["budgets"][0]); }, "3 layers");
  expect_error([](auto& j) { j["budgets"][1].erase(0); }, "budgets[1] must list 2 KV heads");
  expect_error([](auto& j) { j["version"] = 9; }, "version 9");
  expect_error([](auto& j) { j["unit"] = "bytes"; }, "unit 'bytes'");
  expect_error([](auto& j) { j["expert_groups"][0][0] = 5; }, "group 5");
  expect_error([](auto& j) { j.erase("model"); }, "'model'");
  fs::remove(p);
}

TEST(BudgetPlanFile, CarriesTheSurprisalReserveAndOldPlansLoadWithItsDefaults) {
  const auto model = Model::load(kMixtral);
  BudgetPlan plan = BudgetPlan::uniform(model->spec(), 2, BudgetPlan::Unit::kFraction, 0.2);
  EXPECT_EQ(plan.reserve.threshold, ReserveOptions{}.threshold);
  EXPECT_EQ(plan.reserve.cap, ReserveOptions{}.cap);
  EXPECT_EQ(plan.reserve.span, ReserveOptions{}.span);
  plan.reserve = {2.5, 0.1, 2};
  const fs::path p =
      fs::temp_directory_path() / ("ekva_reserve_" + std::to_string(::getpid()) + ".json");
  plan.save(p);
  const BudgetPlan back = BudgetPlan::load(p);
  fs::remove(p);
  EXPECT_EQ(back.reserve.threshold, 2.5);
  EXPECT_EQ(back.reserve.cap, 0.1);
  EXPECT_EQ(back.reserve.span, 2);
  EXPECT_EQ(back.to_json(), plan.to_json());

  nlohmann::json old = plan.to_json();  // as written before plans carried a reserve
  old.erase("reserve");
  EXPECT_EQ(BudgetPlan::from_json(old, "old.json").reserve.threshold, ReserveOptions{}.threshold);
  EXPECT_EQ(BudgetPlan::from_json(old, "old.json").reserve.cap, ReserveOptions{}.cap);
  nlohmann::json partial = plan.to_json();  // a field left out takes its default
  partial["reserve"].erase("threshold");
  EXPECT_EQ(BudgetPlan::from_json(partial, "p.json").reserve.threshold, ReserveOptions{}.threshold);
  EXPECT_EQ(BudgetPlan::from_json(partial, "p.json").reserve.cap, 0.1);

  auto expect_error = [&](const nlohmann::json& reserve, const std::string& needle) {
    nlohmann::json j = plan.to_json();
    j["reserve"] = reserve;
    try {
      BudgetPlan::from_json(j, "plan.json");
      ADD_FAILURE() << "accepted: " << reserve.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("plan.json"), std::string::npos) << e.what();
    }
  };
  expect_error({{"threshold", "3"}}, "field 'reserve.threshold' must be a finite number");
  expect_error({{"cap", 1.5}}, "field 'reserve.cap' must be a number in [0, 1]");
  expect_error({{"cap", -0.1}}, "field 'reserve.cap'");
  expect_error({{"cap", nullptr}}, "field 'reserve.cap'");
  expect_error({{"span", -1}}, "field 'reserve.span' must be an integer >= 0");
  expect_error({{"span", 1.5}}, "field 'reserve.span'");
  expect_error({{"treshold", 2}}, "field 'reserve.treshold' is unknown");
  expect_error(0.25, "field 'reserve' must be an object");
}

// A policy's reserve: its own options field by field over the plan's, the plan's over the
// defaults.
TEST(Policy, TheReserveComesFromThePlanUnlessTheOptionsOverrideIt) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  PolicyOptions o;
  o.name = "ekva";
  o.budget = 0.2;
  EXPECT_EQ(KvPolicy(o, s).reserve().threshold, ReserveOptions{}.threshold);
  EXPECT_EQ(KvPolicy(o, s).reserve().cap, ReserveOptions{}.cap);
  o.plan = BudgetPlan::uniform(s, s.num_experts, BudgetPlan::Unit::kFraction, 0.2);
  o.plan->reserve = {1.5, 0.1, 3};
  EXPECT_EQ(KvPolicy(o, s).reserve().threshold, 1.5);
  EXPECT_EQ(KvPolicy(o, s).reserve().cap, 0.1);
  EXPECT_EQ(KvPolicy(o, s).reserve().span, 3);
  o.reserve.threshold = 4.0;
  EXPECT_EQ(KvPolicy(o, s).reserve().threshold, 4.0);
  EXPECT_EQ(KvPolicy(o, s).reserve().cap, 0.1);
  o.reserve.cap = 0.5;
  EXPECT_EQ(KvPolicy(o, s).reserve().cap, 0.5);
  o.reserve.span = 0;
  EXPECT_EQ(KvPolicy(o, s).reserve().span, 0);
  o.reserve.span = -1;  // an override is checked as the plan's fields are
  EXPECT_THROW(KvPolicy(o, s), Error);
  o.reserve.span.reset();
  o.reserve.cap = 2.0;
  EXPECT_THROW(KvPolicy(o, s), Error);

  // The plan's reserve is the one compression uses: the prompt's two rare tokens are pinned at the
  // plan's threshold, and not at one no token reaches.
  std::vector<int32_t> prompt(240, 7);
  prompt[60] = 150;
  prompt[61] = 151;
  Engine engine(*model);
  engine.prefill(0, prompt);
  for (const double threshold : {3.0, 1e9}) {
    PolicyOptions r;
    r.name = "rarity-tokens";
    r.budget = 0.25;
    r.ada_floor = 1.0;  // no scores were gathered: every head keeps the mean, room for the reserve
    r.plan = BudgetPlan::uniform(s, s.num_experts, BudgetPlan::Unit::kFraction, 0.25);
    r.plan->reserve = {threshold, 0.25, 0};  // per token: the two rare ids, not their neighbours
    KvPolicy policy(r, s);
    const EvictionPlan plan = policy.compress(engine.layout(), 0, 240, PromptRouting{prompt, {}});
    ASSERT_FALSE(plan.segments.empty());
    const std::vector<int32_t> reserved =
        threshold == 3.0 ? std::vector<int32_t>{60, 61} : std::vector<int32_t>{};
    for (const SegmentEviction& segment : plan.segments) EXPECT_EQ(segment.pinned, reserved);
  }
}

// A long decode with eviction holds memory flat: after warm-up, no page is ever reserved again.
TEST(Policy, LongDecodeWithEvictionHoldsMemoryFlat) {
  const fs::path dir = fs::temp_directory_path() / ("ekva_long_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kMixtral + "/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  {
    std::ifstream in(kMixtral + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg["max_position_embeddings"] =
        32768;  // RoPE is defined at any position; the fixture stops at 512
    std::ofstream(dir / "config.json") << cfg.dump();
  }
  const auto model = Model::load(dir);
  PolicyOptions o;
  o.name = "h2o";
  o.budget = 64;
  Engine engine(*model, {}, o);
  const KvLayout& cache = engine.layout();
  prefill(engine, prompt_of(100));
  int64_t reserved_after_warmup = 0;
  size_t bytes_after_warmup = 0;
  for (int step = 0; step < 20000; ++step) {
    engine.decode(0, 3 + step % 200);
    if (step == 100) {
      reserved_after_warmup = cache.page_high_water();
      bytes_after_warmup = cache.kv_bytes_in_use();
    }
  }
  EXPECT_EQ(cache.page_high_water(), reserved_after_warmup);
  EXPECT_EQ(cache.kv_bytes_in_use(), bytes_after_warmup);
  EXPECT_EQ(cache.retained_tokens(), 64u * model->spec().num_layers * model->spec().num_kv_heads);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ekva

namespace ekva {
namespace {

// ekva-online moves group budgets during decode and still holds each head's total exactly.
TEST(Policy, OnlineRefreshKeepsHeadTotals) {
  const auto model = Model::load(kQwen2);
  const ModelSpec& s = model->spec();
  PolicyOptions o;
  o.name = "ekva-online";
  o.budget = 0.25;
  o.refresh = 4;
  Engine engine(*model, {}, o);
  const KvPolicy& policy = *engine.policy();
  const KvLayout& cache = engine.layout();
  prefill(engine, prompt_of(200));
  for (int step = 0; step < 30; ++step) {
    engine.decode(0, 7 + step);
    for (int l = 0; l < s.num_layers; ++l)
      for (int h = 0; h < s.num_kv_heads; ++h)
        EXPECT_EQ(cache.table(0, l, h).size(), policy.head_budget(0, l, h));
  }
  o.refresh = 0;
  EXPECT_THROW(KvPolicy(o, s), Error);
}

}  // namespace
}  // namespace ekva
