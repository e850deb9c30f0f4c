// The second embedded model (models/ekva-qwen3moe-12m, fine-grained routing: top-4 of 32 experts)
// against transformers' Qwen3MoeForCausalLM on the same exported weights:
// tests/fixtures/ekva-qwen3moe-12m/reference.safetensors was written on the GPU machine by
// tools/train_moe.py --arch qwen3_moe (float32 eager forward on the CPU, transformers 5.17.0).
#include <gtest/gtest.h>

#include "engine/generate.h"
#include "support/reference_forward.h"

namespace ekva {
namespace {

const std::string kQwen3Model = std::string(EKVA_FIXTURES) + "/../../models/ekva-qwen3moe-12m";
const std::string kQwen3Reference =
    std::string(EKVA_FIXTURES) + "/ekva-qwen3moe-12m/reference.safetensors";

TEST(Qwen3MoeModel, SpecIsFineGrained) {
  const auto model = Model::load(kQwen3Model);
  const ModelSpec& s = model->spec();
  EXPECT_EQ(s.arch, Architecture::kQwen3Moe);
  EXPECT_EQ(s.num_experts, 32);
  EXPECT_EQ(s.top_k, 4);
  EXPECT_TRUE(s.norm_topk_prob);
  EXPECT_EQ(s.num_moe_layers(), s.num_layers);
  EXPECT_EQ(s.max_position, 4096);
}

TEST(Qwen3MoeModel, LogitsAndRouterLogitsMatchTransformers) {
  testing::expect_forward_matches(*Model::load(kQwen3Model), SafetensorsFile(kQwen3Reference),
                                  7e-5);
}

TEST(Qwen3MoeModel, GreedyGenerationMatchesTransformers) {
  const auto model = Model::load(kQwen3Model);
  SafetensorsFile ref(kQwen3Reference);
  const std::vector<int32_t> want = testing::token_ids(ref.get("greedy_output"));
  Engine engine(*model);
  GenerateOptions options;
  options.max_new_tokens = static_cast<int>(want.size());
  options.stop_at_eos = false;
  EXPECT_EQ(generate(engine, testing::token_ids(ref.get("greedy_prompt")), options).tokens, want);
}

}  // namespace
}  // namespace ekva
