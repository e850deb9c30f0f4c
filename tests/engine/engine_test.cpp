// The engine's seam: the host plan of a step, byte counts by stored element type, and what a
// BudgetPlan keeps when it runs through the engine.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "support/pages_off_host.h"
#include "support/reference_forward.h"

namespace ekva {
namespace {

const std::string kModelDir = std::string(EKVA_FIXTURES) + "/../../models/ekva-moe-8m";
const std::string kMixtral = std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-mixtral";

std::vector<int32_t> prompt_of(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 3 + (i * 37) % 200;
  return p;
}

TEST(PlanStep, ReservesEverySlotAndSchedulesEveryLayerOnTheHost) {
  const auto model = Model::load(kMixtral);
  const ModelSpec& s = model->spec();
  KvLayout layout(s, 3, KvFormat{4, DType::kF32});
  ForwardBatch first;  // sequence 0: 6 tokens, sequence 2: 3 tokens
  for (int t = 0; t < 6; ++t) first.add(10 + t, 0, t);
  for (int t = 0; t < 3; ++t) first.add(20 + t, 2, t);
  const StepPlan a = plan_step(s, first, layout);
  ForwardBatch second;  // one decode token each
  second.add(1, 0, 6);
  second.add(2, 2, 3);
  const StepPlan b = plan_step(s, second, layout);
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (int t = 0; t < 6; ++t) EXPECT_EQ(a.slot(l, t, h), t);
      for (int t = 0; t < 3; ++t) EXPECT_EQ(a.slot(l, 6 + t, h), t);
      EXPECT_EQ(a.length(l, 0, h), 6);
      EXPECT_EQ(a.length(l, 1, h), 0);
      EXPECT_EQ(a.length(l, 2, h), 3);
      EXPECT_EQ(b.slot(l, 0, h), 6);
      EXPECT_EQ(b.slot(l, 1, h), 3);
      EXPECT_EQ(b.length(l, 0, h), 7);
      EXPECT_EQ(b.length(l, 2, h), 4);
      EXPECT_EQ(layout.table(0, l, h).meta[6].position, 6);
    }
  }
  EXPECT_EQ(layout.next_position(0), 7);
  EXPECT_EQ(layout.next_position(1), 0);
  EXPECT_EQ(layout.next_position(2), 4);
  // Pages of 4: two per segment of sequence 0 and one per segment of sequence 2.
  EXPECT_EQ(layout.pages_in_use(), static_cast<size_t>(3 * s.num_layers * s.num_kv_heads));
  EXPECT_EQ(a.expert_rows, 9 * s.top_k);
  EXPECT_EQ(a.logit_rows.size(), 9u);
  EXPECT_EQ(b.logit_rows, (std::vector<int32_t>{0, 1}));

  ForwardBatch bad;
  bad.add(s.vocab_size, 0, 7);
  EXPECT_THROW(plan_step(s, bad, layout), Error);
  bad.tokens[0] = 1;
  bad.seq[0] = 3;
  EXPECT_THROW(plan_step(s, bad, layout), Error);
}

// Tokens of two sequences interleaved: each token's slot counts its own sequence's earlier tokens,
// each table's length is past its sequence's last token, its metadata in token order.
TEST(PlanStep, InterleavedSequencesTakeTheirOwnSlots) {
  const auto model = Model::load(kMixtral);
  const ModelSpec& s = model->spec();
  KvLayout layout(s, 2, KvFormat{2, DType::kF32});
  ForwardBatch batch;
  const int32_t seqs[] = {0, 1, 0, 1, 0};
  const int32_t positions[] = {0, 0, 1, 1, 2};
  for (int t = 0; t < 5; ++t) batch.add(7, seqs[t], positions[t]);
  const StepPlan p = plan_step(s, batch, layout);
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      for (int t = 0; t < 5; ++t) EXPECT_EQ(p.slot(l, t, h), positions[t]) << "token " << t;
      EXPECT_EQ(p.length(l, 0, h), 3);
      EXPECT_EQ(p.length(l, 1, h), 2);
      for (int q = 0; q < 2; ++q) {
        const HeadTable& table = layout.table(q, l, h);
        ASSERT_EQ(table.size(), 3 - q);
        for (int i = 0; i < table.size(); ++i) EXPECT_EQ(table.meta[i].position, i);
        EXPECT_EQ(table.pages.size(), q == 0 ? 2u : 1u);  // pages of 2 slots
      }
    }
  }
}

TEST(PlanStep, AFullLayoutIsAnOutOfMemoryError) {
  const auto model = Model::load(kMixtral);
  KvLayout layout(model->spec(), 1, KvFormat{4, DType::kF32}, /*capacity_pages=*/3);
  ForwardBatch batch;
  for (int t = 0; t < 8; ++t) batch.add(5, 0, t);
  try {
    plan_step(model->spec(), batch, layout);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
  }
}

TEST(Engine, KvBytesArePagesTimesThePageBytesOfTheStoredType) {
  const auto model = Model::load(kModelDir);
  const ModelSpec& s = model->spec();
  std::vector<float> logits[2];
  size_t bytes[2];
  for (int i = 0; i < 2; ++i) {
    EngineOptions o;
    o.kv.dtype = i == 0 ? DType::kF32 : DType::kBF16;
    Engine engine(*model, o);
    logits[i] = engine.prefill(0, prompt_of(70));
    const KvLayout& layout = engine.layout();
    const size_t page_bytes = 2 * 16 * static_cast<size_t>(s.head_dim) * (i == 0 ? 4 : 2);
    EXPECT_EQ(layout.page_bytes(), page_bytes);
    EXPECT_EQ(layout.pages_in_use(), static_cast<size_t>(5 * s.num_layers * s.num_kv_heads));
    bytes[i] = layout.kv_bytes_in_use();
    EXPECT_EQ(bytes[i], layout.pages_in_use() * page_bytes);
    EXPECT_EQ(layout.full_bytes(70), bytes[i]);
  }
  EXPECT_EQ(bytes[0], 2 * bytes[1]);
  // bf16 K/V change the logits by about bf16's rounding, no more.
  EXPECT_LE(testing::relative_error(logits[1].data(), logits[0].data(), logits[0].size()), 2e-2);
  EXPECT_GT(testing::relative_error(logits[1].data(), logits[0].data(), logits[0].size()), 0.0);
}

// `plan --budget 0.25` then a policy with the plan and no --budget keeps 25% (within one page per
// segment), and the plan's sinks and recent window are kept on top.
TEST(Engine, APlanAloneKeepsItsBudgetAndItsSinksAndRecentWindow) {
  const auto model = Model::load(kModelDir);
  const ModelSpec& s = model->spec();
  const int n = 400;
  for (const std::string name : {"ekva-quota", "ekva-nogroup"}) {
    PolicyOptions o;
    o.name = name;
    o.plan = BudgetPlan::uniform(s, s.num_experts, BudgetPlan::Unit::kFraction, 0.25);
    Engine plain(*model, {}, o);
    plain.prefill(0, prompt_of(n));
    plain.compress(0, n);
    const size_t segments = static_cast<size_t>(s.num_layers) * s.num_kv_heads;
    EXPECT_EQ(plain.layout().retained_tokens(), segments * 100) << name;
    EXPECT_LE(plain.layout().kv_bytes_in_use(),
              plain.layout().full_bytes(n) / 4 + segments * plain.layout().page_bytes());

    o.plan->sink_tokens = 3;
    o.plan->recent_tokens = 5;
    Engine engine(*model, {}, o);
    engine.prefill(0, prompt_of(n));
    engine.compress(0, n);
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const HeadTable& t = engine.layout().table(0, l, h);
        EXPECT_EQ(t.size(), 100 + 3 + 5);
        for (int32_t p : {0, 1, 2, n - 1, n - 5, n - 16 - 5}) {  // sinks, recent, the window
          EXPECT_TRUE(std::any_of(t.meta.begin(), t.meta.end(),
                                  [&](const TokenMeta& m) { return m.position == p; }))
              << name << " layer " << l << " head " << h << " position " << p;
        }
      }
    }
    // Decode holds the same total.
    for (int i = 0; i < 5; ++i) engine.decode(0, 7);
    EXPECT_EQ(engine.layout().retained_tokens(), segments * 108) << name;
  }
}

TEST(Engine, RefusesKeyDiffWhereTheKeysAreNotOnTheHost) {
  const auto model = Model::load(kMixtral);
  EngineOptions off_host;
  off_host.backend = testing::pages_off_host();
  off_host.device = "cuda";
  PolicyOptions keydiff;
  keydiff.name = "keydiff";
  keydiff.budget = 0.25;
  try {
    Engine engine(*model, off_host, keydiff);
    FAIL() << "keydiff was accepted on a backend without host pages";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("'keydiff'"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda backend"), std::string::npos) << what;
  }
  Engine engine(*model, off_host);
  EXPECT_THROW(engine.check_policy(keydiff), Error);
  EXPECT_THROW(engine.set_policy(0, keydiff), Error);
  EXPECT_EQ(engine.policy(0), nullptr);  // a refused policy leaves the sequence as it was
  PolicyOptions adakv = keydiff;
  adakv.name = "adakv";  // ranks by attention scores, which every backend fills
  EXPECT_NO_THROW(engine.set_policy(0, adakv));
  // The CPU backend has its keys on the host.
  EXPECT_NO_THROW(Engine(*model, {}, keydiff));
}

// A checkpoint whose final norm holds a NaN gives an error naming the model, not tokens.
TEST(Engine, NonFiniteLogitsAreAnErrorNotTokens) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ekva_nan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kMixtral + "/config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  fs::copy_file(kMixtral + "/model.safetensors", dir / "model.safetensors",
                fs::copy_options::overwrite_existing);
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_len));
    const auto offsets = nlohmann::json::parse(header)["model.norm.weight"]["data_offsets"];
    f.seekp(static_cast<std::streamoff>(8 + header_len + offsets[0].get<uint64_t>()));
    const char nan_bytes[4] = {0, 0, static_cast<char>(0xc0), 0x7f};  // a float32 or bf16 NaN
    f.write(nan_bytes, 4);
  }
  const auto model = Model::load(dir);
  Engine engine(*model);
  try {
    engine.prefill(0, prompt_of(5));
    ADD_FAILURE() << "NaN logits accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
  // A greedy decode step names the first entry that is not finite (every logit is NaN here).
  Engine greedy(*model);
  const int seq = 0;
  const int32_t token = 5;
  try {
    const TokenDraw draw;
    greedy.decode_tokens(std::span<const int>(&seq, 1), std::span<const int32_t>(&token, 1),
                         std::span<const TokenDraw>(&draw, 1));
    ADD_FAILURE() << "NaN logits accepted by decode_tokens";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("vocabulary entry 0"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Tokens drawn for two sequences in one step, one greedy and one sampled, are what draw_token
// picks from the logits decode() returns for the same step.
TEST(Engine, DecodeTokensDrawFromTheLogitsOfDecode) {
  const auto model = Model::load(kMixtral);
  EngineOptions options;
  options.num_sequences = 2;
  Engine with_logits(*model, options);
  Engine drawn(*model, options);
  const std::vector<int> seqs = {0, 1};
  std::vector<int32_t> tokens = {5, 9};
  const int vocab = model->spec().vocab_size;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 8; ++step) {
    const std::vector<TokenDraw> draws = {
        TokenDraw{}, TokenDraw{0.9f, 20, 0.95f, std::uniform_real_distribution<double>()(rng)}};
    if (step == 0) {  // a draw out of range is refused before the step changes anything
      const std::vector<TokenDraw> bad = {TokenDraw{}, TokenDraw{0.9f, 20, 1.5f, 0.5}};
      EXPECT_THROW(drawn.decode_tokens(seqs, tokens, bad), Error);
      EXPECT_EQ(drawn.layout().next_position(0), 0);
    }
    const std::vector<float> logits = with_logits.decode(seqs, tokens);
    const std::vector<int32_t> got = drawn.decode_tokens(seqs, tokens, draws);
    ASSERT_EQ(got.size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t want = draw_token(logits.data() + i * vocab, vocab, draws[i]);
      EXPECT_EQ(got[i], want) << "step " << step << ", sequence " << seqs[i];
      tokens[i] = want;
    }
  }
}

}  // namespace
}  // namespace ekva
