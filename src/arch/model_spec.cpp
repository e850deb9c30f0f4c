#include "arch/model_spec.h"

namespace ekva {

const char* architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kMixtral:
      return "mixtral";
    case Architecture::kQwen2Moe:
      return "qwen2_moe";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kOlmoe:
      return "olmoe";
  }
  return "?";
}

int ModelSpec::num_moe_layers() const {
  int n = 0;
  for (bool m : layer_is_moe) n += m ? 1 : 0;
  return n;
}

ModelSpec::ParameterCount ModelSpec::parameters() const {
  const int64_t h = hidden_size;
  int64_t attn = h * q_dim() + 2 * h * kv_dim() + static_cast<int64_t>(q_dim()) * h;
  if (qkv_bias) attn += q_dim() + 2 * kv_dim();
  if (o_bias) attn += h;
  if (qk_norm == QkNorm::kPerHead) attn += 2 * head_dim;
  if (qk_norm == QkNorm::kWholeProjection) attn += q_dim() + kv_dim();
  const int64_t norms = 2 * h;
  const int64_t expert = 3 * h * expert_intermediate;
  const int64_t shared =
      shared_intermediate > 0 ? 3 * h * shared_intermediate + (shared_expert_gated ? h : 0) : 0;
  ParameterCount p;
  for (int l = 0; l < num_layers; ++l) {
    const int64_t base = attn + norms;
    if (layer_is_moe[l]) {
      const int64_t router = h * num_experts;
      p.total += base + router + num_experts * expert + shared;
      p.active_per_token += base + router + top_k * expert + shared;
    } else {
      const int64_t mlp = 3 * h * dense_intermediate;
      p.total += base + mlp;
      p.active_per_token += base + mlp;
    }
  }
  const int64_t embed = static_cast<int64_t>(vocab_size) * h;
  p.total += embed + h + (tie_embeddings ? 0 : embed);
  p.active_per_token += embed + h + (tie_embeddings ? 0 : embed);
  return p;
}

}  // namespace ekva
