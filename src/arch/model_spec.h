#pragma once
// The architecture-independent description of an MoE decoder. Everything downstream (forward,
// KV cache, roofline, calibration) reads this, never config.json.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ekva {

enum class Architecture { kMixtral, kQwen2Moe, kQwen3Moe, kOlmoe };
const char* architecture_name(Architecture arch);

// Where q/k RMSNorm applies: none; per head over head_dim (Qwen3-MoE); over the whole projection
// (OLMoE).
enum class QkNorm { kNone, kPerHead, kWholeProjection };

enum class RopeScaling { kNone, kLinear, kLlama3, kYarn };

struct RopeSpec {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;
  int original_max_position = 0;  // llama3 and yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  double attention_factor = 1.0;  // yarn: scales cos and sin
};

struct ModelSpec {
  Architecture arch = Architecture::kMixtral;
  std::string model_type;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position = 0;

  int num_experts = 0;
  int top_k = 0;
  bool norm_topk_prob = false;
  int expert_intermediate = 0;  // each routed expert's SwiGLU width
  int dense_intermediate = 0;   // the MLP width of layers without a router
  int shared_intermediate = 0;  // 0: no shared expert
  bool shared_expert_gated = false;
  std::vector<bool> layer_is_moe;  // per layer: a routed MoE block, else a dense MLP

  bool qkv_bias = false;
  bool o_bias = false;
  QkNorm qk_norm = QkNorm::kNone;
  std::optional<float> clip_qkv;
  double rms_eps = 1e-6;
  RopeSpec rope;
  bool tie_embeddings = false;
  std::optional<int> bos_id;
  std::vector<int> eos_ids;
  DType weight_dtype = DType::kF32;

  int q_dim() const { return num_heads * head_dim; }
  int kv_dim() const { return num_kv_heads * head_dim; }
  int num_moe_layers() const;
  // Bytes of K and V one token occupies across all layers at the given element size.
  int64_t kv_bytes_per_token(size_t element_bytes) const {
    return 2 * static_cast<int64_t>(num_layers) * kv_dim() * static_cast<int64_t>(element_bytes);
  }
  struct ParameterCount {
    int64_t total = 0;
    // top_k experts; the embedding matrix counted whole, as published model cards do
    int64_t active_per_token = 0;
  };
  ParameterCount parameters() const;
};

}  // namespace ekva
