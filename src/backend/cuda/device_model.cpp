#include "backend/cuda/device_model.h"

#include <algorithm>
#include <span>

#include "arch/rope_table.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

// Matrices are converted a block of rows at a time, so the host holds at most one block of floats.
constexpr int kConvertRows = 1024;

void append_bf16(const WeightMatrix& w, std::vector<uint16_t>& out) {
  const size_t cols = static_cast<size_t>(w.cols);
  const size_t row_bytes = cols * dtype_size(w.dtype);
  std::vector<float> block;
  for (int r = 0; r < w.rows; r += kConvertRows) {
    const int rows = std::min(kConvertRows, w.rows - r);
    const auto* src = static_cast<const char*>(w.data) + r * row_bytes;
    const size_t count = rows * cols;
    const size_t at = out.size();
    out.resize(at + count);
    if (w.dtype == DType::kBF16) {
      std::copy_n(reinterpret_cast<const uint16_t*>(src), count, out.begin() + at);
    } else {
      block.resize(count);
      to_f32(w.dtype, src, block.data(), count);
      std::transform(block.begin(), block.end(), out.begin() + at, f32_to_bf16);
    }
  }
}

DeviceMatrix upload(std::initializer_list<const WeightMatrix*> stacked) {
  std::vector<uint16_t> host;
  DeviceMatrix m;
  for (const WeightMatrix* w : stacked) {
    append_bf16(*w, host);
    m.rows += w->rows;
    m.cols = w->cols;
  }
  m.data = DeviceBuffer<uint16_t>(std::span<const uint16_t>(host));
  return m;
}

DeviceBuffer<float> upload_f32(const std::vector<float>& v) {
  return DeviceBuffer<float>(std::span<const float>(v));
}

DeviceBuffer<float> upload_f32(const WeightMatrix& w) {
  std::vector<float> host(static_cast<size_t>(w.rows) * w.cols);
  to_f32(w.dtype, w.data, host.data(), host.size());
  return upload_f32(host);
}

DeviceMlp upload(const Mlp& mlp) {
  return {upload({&mlp.gate, &mlp.up}), upload({&mlp.down})};
}

size_t mlp_bytes(const Mlp& mlp) {
  return 2 * (static_cast<size_t>(mlp.gate.rows) * mlp.gate.cols +
              static_cast<size_t>(mlp.up.rows) * mlp.up.cols +
              static_cast<size_t>(mlp.down.rows) * mlp.down.cols);
}

size_t bf16_bytes(const WeightMatrix& w) {
  return 2 * static_cast<size_t>(w.rows) * w.cols;
}

}  // namespace

size_t DeviceModel::weight_bytes(const Model& model) {
  const ModelSpec& s = model.spec();
  size_t bytes = bf16_bytes(model.embed()) + bf16_bytes(model.lm_head());
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = model.layer(l);
    bytes += bf16_bytes(L.q) + bf16_bytes(L.k) + bf16_bytes(L.v) + bf16_bytes(L.o);
    bytes += 4 * static_cast<size_t>(L.router.rows) * L.router.cols;
    for (const Mlp& e : L.experts) bytes += mlp_bytes(e);
    if (s.layer_is_moe[l] && s.shared_intermediate > 0) bytes += mlp_bytes(L.shared);
    if (!s.layer_is_moe[l]) bytes += mlp_bytes(L.dense);
  }
  return bytes;
}

DeviceModel::DeviceModel(const Model& model, size_t reserve_bytes) : model_(&model) {
  const ModelSpec& s = model.spec();
  bytes_ = weight_bytes(model);
  size_t free_bytes = 0, total_bytes = 0;
  EKVA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes_ + reserve_bytes > free_bytes) {
    fail(ErrorKind::kOutOfMemory,
         "{}: the weights ({} bytes in bf16) and the KV pool ({} bytes) need {} bytes of GPU "
         "memory; {} of {} bytes are free",
         model.dir().string(), bytes_, reserve_bytes, bytes_ + reserve_bytes, free_bytes,
         total_bytes);
  }
  embed_ = upload({&model.embed()});
  lm_head_ = upload({&model.lm_head()});
  final_norm_ = upload_f32(model.final_norm());
  layers_.resize(s.num_layers);
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = model.layer(l);
    DeviceLayer& D = layers_[l];
    D.attn_norm = upload_f32(L.attn_norm);
    D.mlp_norm = upload_f32(L.mlp_norm);
    D.q_norm = upload_f32(L.q_norm);
    D.k_norm = upload_f32(L.k_norm);
    D.q_bias = upload_f32(L.q_bias);
    D.k_bias = upload_f32(L.k_bias);
    D.v_bias = upload_f32(L.v_bias);
    D.o_bias = upload_f32(L.o_bias);
    D.q = upload({&L.q});
    D.k = upload({&L.k});
    D.v = upload({&L.v});
    D.o = upload({&L.o});
    if (s.layer_is_moe[l]) {
      D.router = upload_f32(L.router);
      for (const Mlp& e : L.experts) D.experts.push_back(upload(e));
      if (s.shared_intermediate > 0) {
        D.shared = upload(L.shared);
        if (s.shared_expert_gated) D.shared_gate = upload_f32(L.shared_gate);
      }
    } else {
      D.dense = upload(L.dense);
    }
  }
  const RopeTable rope = make_rope_table(s.rope, s.head_dim);
  std::vector<float> inv_freq(rope.inv_freq.begin(), rope.inv_freq.end());
  inv_freq_ = upload_f32(inv_freq);
  attention_factor_ = static_cast<float>(rope.attention_factor);
}

}  // namespace ekva::cuda
