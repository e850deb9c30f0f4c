#pragma once
// A loaded checkpoint: its ModelSpec and views of every weight, in place in the mapped files.
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "arch/model_spec.h"
#include "core/weight_matrix.h"
#include "io/safetensors.h"

namespace ekva {

struct Mlp {  // SwiGLU: down(silu(gate(x)) * up(x))
  WeightMatrix gate, up, down;
};

struct LayerWeights {
  std::vector<float> attn_norm, mlp_norm;
  WeightMatrix q, k, v, o;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty when the architecture has none
  std::vector<float> q_norm, k_norm;                  // empty unless spec.qk_norm != kNone
  WeightMatrix router;                                // MoE layers only
  std::vector<Mlp> experts;
  Mlp shared;                // used when spec.shared_intermediate > 0
  WeightMatrix shared_gate;  // [1, hidden] when the shared expert is gated
  Mlp dense;                 // layers without a router
};

class Model {
 public:
  // Reads config.json and the safetensors of `dir`, checking every tensor's presence and shape.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir);
  // A model of this shape whose weights live elsewhere: seeded random weights made on a GPU
  // (cuda::DeviceModel), for configurations too large to ship. Only spec() and dir() (`source`,
  // the configuration it came from) mean anything; has_weights() is false, and the CPU backend and
  // the upload of host weights refuse it.
  static std::unique_ptr<Model> without_weights(const ModelSpec& spec,
                                                const std::filesystem::path& source);

  const ModelSpec& spec() const { return spec_; }
  const std::filesystem::path& dir() const { return dir_; }
  bool has_weights() const { return store_.has_value(); }
  const WeightMatrix& embed() const { return embed_; }
  const WeightMatrix& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  const LayerWeights& layer(int l) const { return layers_[l]; }
  // Bytes of the weights one decode token reads: attention, router, top_k experts, shared expert,
  // LM head, one embedding row. 0 without weights.
  size_t active_weight_bytes_per_token() const;

 private:
  Model(const std::filesystem::path& dir, ModelSpec spec);
  std::filesystem::path dir_;
  ModelSpec spec_;
  std::optional<TensorStore> store_;  // none without weights
  WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace ekva
