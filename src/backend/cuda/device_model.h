#pragma once
// A model's weights on the device, uploaded once: matrices in bf16 (f32 and f16 checkpoints are
// converted on the way), each expert's gate and up fused into one [2 * inter, hidden] matrix and
// each layer's Q, K and V into one [q_dim + 2 * kv_dim, hidden] matrix,
// norms, biases and the routers in float32. Shared by every backend that runs the model. Or, for
// configurations too large to ship (Mixtral-8x7B is 93 GB), seeded random weights made on the
// device, so that full-size models can be timed.
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "model/model.h"

namespace ekva::cuda {

struct DeviceMatrix {
  DeviceBuffer<uint16_t> data;  // bf16, row-major [rows, cols]
  int rows = 0;
  int cols = 0;
};

struct DeviceMlp {
  DeviceMatrix gate_up;  // [gate; up]
  DeviceMatrix down;
  int inter() const { return down.cols; }
};

struct DeviceLayer {
  DeviceBuffer<float> attn_norm, mlp_norm, q_norm, k_norm;
  DeviceBuffer<float> q_bias, k_bias, v_bias, o_bias;  // empty when the architecture has none
  DeviceMatrix qkv, o;                                 // qkv: [Q; K; V]
  DeviceBuffer<float> router;                          // [num_experts, hidden], MoE layers only
  DeviceBuffer<float> shared_gate;  // [1, hidden] when the shared expert is gated
  std::vector<DeviceMlp> experts;
  // Each expert's gate_up and down weights, for kernels that pick the expert on the device.
  DeviceBuffer<const uint16_t*> expert_gate_up, expert_down;
  DeviceMlp shared;
  DeviceMlp dense;
};

class DeviceModel {
 public:
  // Uploads every weight; fails with kOutOfMemory naming the bytes needed and free when the
  // weights do not fit beside `reserve_bytes` (the KV pool the caller will allocate).
  DeviceModel(const Model& model, size_t reserve_bytes);
  // Random weights of the shape `spec` describes: matrices uniform with standard deviation 0.02,
  // norms 1, biases 0; the same seed gives the same weights. `source` names the configuration.
  DeviceModel(const ModelSpec& spec, uint64_t seed, size_t reserve_bytes,
              const std::string& source);

  const ModelSpec& spec() const { return spec_; }
  const DeviceMatrix& embed() const { return embed_; }
  const DeviceMatrix& lm_head() const { return lm_head_; }
  const DeviceBuffer<float>& final_norm() const { return final_norm_; }
  const DeviceLayer& layer(int l) const { return layers_[l]; }
  const DeviceBuffer<float>& inv_freq() const { return inv_freq_; }
  float attention_factor() const { return attention_factor_; }
  size_t bytes() const { return bytes_; }

  // Bytes the weights of a model of this shape take on the device.
  static size_t weight_bytes(const ModelSpec& spec);

 private:
  // Fails with kOutOfMemory unless the weights and reserve_bytes fit in free device memory.
  void check_fits(size_t reserve_bytes, const std::string& source) const;
  void set_rope();
  void set_expert_tables();

  ModelSpec spec_;
  DeviceMatrix embed_, lm_head_;
  DeviceBuffer<float> final_norm_;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer<float> inv_freq_;
  float attention_factor_ = 1.0f;
  size_t bytes_ = 0;
};

}  // namespace ekva::cuda
