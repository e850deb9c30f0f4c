#include "io/model_config.h"

#include <gtest/gtest.h>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "io/json_file.h"

namespace ekva {
namespace {

using nlohmann::json;

json mixtral_v4() {
  // The older (transformers 4) form: rope_theta and torch_dtype at the top level.
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": false,
    "bos_token_id": 1, "eos_token_id": 2, "sliding_window": null})");
}

TEST(ModelConfig, ReadsOlderFormAndCountsMixtralParameters) {
  const ModelSpec s = parse_model_config(mixtral_v4(), "mixtral");
  EXPECT_EQ(s.arch, Architecture::kMixtral);
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_DOUBLE_EQ(s.rope.theta, 1e6);
  EXPECT_EQ(s.weight_dtype, DType::kBF16);
  EXPECT_TRUE(s.norm_topk_prob);
  EXPECT_EQ(s.kv_bytes_per_token(2), 131072);
  // Mixtral-8x7B: 46.7B total, 12.9B active (Mistral AI's published figures).
  const auto p = s.parameters();
  EXPECT_NEAR(p.total / 1e9, 46.7, 0.05);
  EXPECT_NEAR(p.active_per_token / 1e9, 12.9, 0.05);
}

TEST(ModelConfig, ReadsTransformers5Form) {
  json j = mixtral_v4();
  j.erase("rope_theta");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}};
  j["dtype"] = "float16";
  const ModelSpec s = parse_model_config(j, "mixtral");
  EXPECT_DOUBLE_EQ(s.rope.theta, 5e5);
  EXPECT_EQ(s.weight_dtype, DType::kF16);
}

TEST(ModelConfig, Qwen2MoeSparseStepAndMlpOnlyLayers) {
  const json j =
      json::parse(R"({"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 96,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 6, "num_experts_per_tok": 2,
    "vocab_size": 100, "max_position_embeddings": 128, "decoder_sparse_step": 2, "mlp_only_layers": [3],
    "norm_topk_prob": false})");
  const ModelSpec s = parse_model_config(j, "qwen2");
  EXPECT_EQ(s.layer_is_moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_TRUE(s.qkv_bias);
  EXPECT_TRUE(s.shared_expert_gated);
  EXPECT_FALSE(s.norm_topk_prob);
}

TEST(ModelConfig, Qwen3MoeHeadDimIndependentOfHidden) {
  const json j =
      json::parse(R"({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0})");
  const ModelSpec s = parse_model_config(j, "qwen3");
  EXPECT_EQ(s.head_dim, 128);
  EXPECT_EQ(s.q_dim(), 4096);
  EXPECT_EQ(s.qk_norm, QkNorm::kPerHead);
  EXPECT_TRUE(s.norm_topk_prob);
  // Qwen3-30B-A3B: 30.5B total, 3.3B active (Qwen's published figures).
  const auto p = s.parameters();
  EXPECT_NEAR(p.total / 1e9, 30.5, 0.1);
  EXPECT_NEAR(p.active_per_token / 1e9, 3.3, 0.1);  // published to 0.1B (3.35 reads "3.3B")
}

TEST(ModelConfig, RejectsUnknownArchitectureByName) {
  json j = mixtral_v4();
  j["model_type"] = "llama";
  try {
    parse_model_config(j, "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("'llama'"), std::string::npos);
  }
}

TEST(ModelConfig, RejectsMissingFieldAndBadRopeType) {
  json j = mixtral_v4();
  j.erase("hidden_size");
  EXPECT_THROW(parse_model_config(j, "cfg.json"), Error);
  j = mixtral_v4();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  try {
    parse_model_config(j, "cfg.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dynamic"), std::string::npos);
  }
}

TEST(ModelConfig, RopeScalingVariants) {
  json j = mixtral_v4();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  ModelSpec s = parse_model_config(j, "cfg");
  EXPECT_EQ(s.rope.scaling, RopeScaling::kLinear);
  // Linear scaling by 4 at position 8 equals no scaling at position 2.
  std::vector<float> a(128, 0.5f), b(128, 0.5f);
  const int32_t p8 = 8, p2 = 2;
  cpu::Rope(s.rope, 128).apply(a.data(), 1, 1, &p8);
  cpu::Rope(RopeSpec{1e6}, 128).apply(b.data(), 1, 1, &p2);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(a[i], b[i], 1e-5);

  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  s = parse_model_config(j, "cfg");
  EXPECT_EQ(s.rope.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(s.rope.original_max_position, 8192);

  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
  s = parse_model_config(j, "cfg");
  EXPECT_EQ(s.rope.scaling, RopeScaling::kYarn);
  EXPECT_NEAR(s.rope.attention_factor, 0.1 * std::log(4.0) + 1.0, 1e-12);
}

// What parse_model_config says about `j`, or "" when it accepts it.
std::string config_error(const json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, FieldsOfTheWrongJsonTypeAreNamedErrors) {
  const std::vector<std::pair<const char*, json>> cases = {
      {"eos_token_id", json::parse(R"(["a"])")},
      {"eos_token_id", json::parse("[null]")},
      {"mlp_only_layers", "x"},
      {"rope_parameters", "x"},
      {"rope_scaling", json::array({1})},
  };
  for (const auto& [key, value] : cases) {
    json j = mixtral_v4();
    if (std::string(key) == "mlp_only_layers") {
      j["model_type"] = "qwen3_moe";
      j["moe_intermediate_size"] = 64;
    }
    j[key] = value;
    const std::string error = config_error(j);
    EXPECT_NE(error.find(std::string("config.json: field '") + key), std::string::npos)
        << key << ": " << error;
  }
}

TEST(ModelConfig, IntegersAreNeverNarrowed) {
  // 2^32 + 211 must not read as 211, nor 2^31 as a negative number.
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_local_experts",
                          "num_attention_heads", "max_position_embeddings"}) {
    for (const uint64_t value : {uint64_t{4294967507}, uint64_t{2147483648}, ~uint64_t{0}}) {
      json j = mixtral_v4();
      j[key] = value;
      const std::string error = config_error(j);
      EXPECT_NE(error.find(std::string("field '") + key + "' must be in [1, "), std::string::npos)
          << key << " = " << value << ": " << error;
    }
  }
  json j = mixtral_v4();
  j["eos_token_id"] = json::array({2, 4294967298});
  EXPECT_NE(config_error(j).find("eos_token_id[1]"), std::string::npos);
}

TEST(ModelConfig, ZeroIsRefusedWhereAPositiveCountIsNeeded) {
  // Found by fuzz_model_config: 0 is stored as an unsigned number and passed the lower bound,
  // then num_key_value_heads = 0 divided by zero.
  for (const char* key : {"num_key_value_heads", "hidden_size", "num_hidden_layers",
                          "num_attention_heads", "num_local_experts", "vocab_size"}) {
    json j = mixtral_v4();
    j[key] = 0;
    EXPECT_NE(config_error(j).find(std::string("field '") + key + "' must be in [1, "),
              std::string::npos)
        << key;
  }
}

TEST(ModelConfig, ShapesBeyondTheLimitsAreRefusedBeforeAnythingIsSized) {
  json j = mixtral_v4();
  j["num_hidden_layers"] = 2147483647;
  EXPECT_NE(config_error(j).find("num_hidden_layers"), std::string::npos);
  j = mixtral_v4();
  j["num_attention_heads"] = 1 << 20;
  j["num_key_value_heads"] = 1 << 20;
  EXPECT_NE(config_error(j).find("num_attention_heads"), std::string::npos);
  j = mixtral_v4();
  j["head_dim"] = 1 << 30;
  EXPECT_NE(config_error(j).find("head_dim"), std::string::npos);
}

TEST(ModelConfig, NonFiniteOrNonPositiveNumbersAreRefused) {
  const std::vector<std::pair<const char*, json>> cases = {
      {"rope_theta", 0}, {"rope_theta", -1}, {"rms_norm_eps", -1}, {"rms_norm_eps", 0}};
  for (const auto& [key, value] : cases) {
    json j = mixtral_v4();
    j[key] = value;
    EXPECT_NE(config_error(j).find(std::string("field '") + key + "' must be a finite number"),
              std::string::npos)
        << key << " = " << value;
  }
  // JSON has no NaN or infinity; 1e999 is refused while parsing.
  EXPECT_THROW(parse_json(R"({"rope_theta": 1e999})", "config.json"), Error);
  json config = mixtral_v4();
  config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
  EXPECT_NE(config_error(config).find("'factor' must be a finite number above 0"),
            std::string::npos);
}

TEST(ModelConfig, DeeplyNestedRopeParametersAreRefusedAtParse) {
  const std::string text = R"({"model_type": "mixtral", "rope_parameters": {"x": )" +
                           std::string(200000, '[') + std::string(200000, ']') + "}}";
  try {
    parse_json(text, "config.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find("config.json: JSON nested deeper than 64 levels"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace ekva
