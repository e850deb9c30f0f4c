#include "backend/cuda/device_model.h"

#include <algorithm>
#include <span>

#include "arch/rope_table.h"
#include "backend/cuda/model_ops.h"
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

// Sizes of a model's device weights, from its shape alone.
struct Shapes {
  explicit Shapes(const ModelSpec& s) : spec(s) {}
  size_t matrix(int rows, int cols) const { return 2 * static_cast<size_t>(rows) * cols; }
  size_t mlp(int inter) const { return 3 * matrix(inter, spec.hidden_size); }
  const ModelSpec& spec;
};

// Random matrices and vectors, each from its own stream of the seed.
class RandomWeights {
 public:
  RandomWeights(uint64_t seed, cudaStream_t stream) : seed_(seed), stream_(stream) {}
  DeviceMatrix matrix(int rows, int cols) {
    DeviceMatrix m;
    m.rows = rows;
    m.cols = cols;
    m.data = DeviceBuffer<uint16_t>(static_cast<size_t>(rows) * cols);
    fill_random_bf16(m.data.data(), static_cast<int64_t>(m.data.size()), next(), kStd, stream_);
    return m;
  }
  DeviceBuffer<float> vector(size_t count, float value) {
    DeviceBuffer<float> v(count);
    fill_constant(v.data(), static_cast<int64_t>(count), value, stream_);
    return v;
  }
  DeviceBuffer<float> random_f32(size_t count) {
    DeviceBuffer<float> v(count);
    fill_random_f32(v.data(), static_cast<int64_t>(count), next(), kStd, stream_);
    return v;
  }
  DeviceMlp mlp(int inter, int hidden) {
    return {matrix(2 * inter, hidden), matrix(hidden, inter)};
  }

 private:
  static constexpr float kStd = 0.02f;
  uint64_t next() { return seed_ * 0x9e3779b97f4a7c15ull + ++streams_; }
  uint64_t seed_;
  uint64_t streams_ = 0;
  cudaStream_t stream_;
};

}  // namespace

size_t DeviceModel::weight_bytes(const ModelSpec& s) {
  const Shapes shapes(s);
  size_t bytes = 2 * shapes.matrix(s.vocab_size, s.hidden_size);
  for (int l = 0; l < s.num_layers; ++l) {
    bytes +=
        2 * shapes.matrix(s.q_dim(), s.hidden_size) + 2 * shapes.matrix(s.kv_dim(), s.hidden_size);
    if (s.layer_is_moe[l]) {
      bytes += 4 * static_cast<size_t>(s.num_experts) * s.hidden_size;
      bytes += static_cast<size_t>(s.num_experts) * shapes.mlp(s.expert_intermediate);
      if (s.shared_intermediate > 0) bytes += shapes.mlp(s.shared_intermediate);
    } else {
      bytes += shapes.mlp(s.dense_intermediate);
    }
  }
  return bytes;
}

void DeviceModel::check_fits(size_t reserve_bytes, const std::string& source) const {
  size_t free_bytes = 0, total_bytes = 0;
  EKVA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (bytes_ + reserve_bytes > free_bytes) {
    fail(ErrorKind::kOutOfMemory,
         "{}: the weights ({} bytes in bf16) and the KV pool ({} bytes) need {} bytes of GPU "
         "memory; {} of {} bytes are free",
         source, bytes_, reserve_bytes, bytes_ + reserve_bytes, free_bytes, total_bytes);
  }
}

void DeviceModel::set_rope() {
  const RopeTable rope = make_rope_table(spec_.rope, spec_.head_dim);
  const std::vector<float> inv_freq(rope.inv_freq.begin(), rope.inv_freq.end());
  inv_freq_ = upload_f32(inv_freq);
  attention_factor_ = static_cast<float>(rope.attention_factor);
}

void DeviceModel::set_expert_tables() {
  for (DeviceLayer& D : layers_) {
    if (D.experts.empty()) continue;
    std::vector<const uint16_t*> gate_up, down;
    for (const DeviceMlp& e : D.experts) {
      gate_up.push_back(e.gate_up.data.data());
      down.push_back(e.down.data.data());
    }
    D.expert_gate_up = DeviceBuffer<const uint16_t*>(std::span<const uint16_t* const>(gate_up));
    D.expert_down = DeviceBuffer<const uint16_t*>(std::span<const uint16_t* const>(down));
  }
}

DeviceModel::DeviceModel(const Model& model, size_t reserve_bytes)
    : spec_(model.spec()), bytes_(weight_bytes(model.spec())) {
  const ModelSpec& s = spec_;
  if (!model.has_weights()) {
    fail(ErrorKind::kInvalidArgument,
         "{}: the model has no host weights to upload; its random weights are made on the device "
         "(DeviceModel from a ModelSpec and a seed)",
         model.dir().string());
  }
  check_fits(reserve_bytes, model.dir().string());
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
    D.qkv = upload({&L.q, &L.k, &L.v});
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
  set_rope();
  set_expert_tables();
}

DeviceModel::DeviceModel(const ModelSpec& spec, uint64_t seed, size_t reserve_bytes,
                         const std::string& source)
    : spec_(spec), bytes_(weight_bytes(spec)) {
  const ModelSpec& s = spec_;
  check_fits(reserve_bytes, source);
  RandomWeights random(seed, nullptr);
  const int hidden = s.hidden_size;
  embed_ = random.matrix(s.vocab_size, hidden);
  lm_head_ = random.matrix(s.vocab_size, hidden);
  final_norm_ = random.vector(hidden, 1.0f);
  layers_.resize(s.num_layers);
  for (int l = 0; l < s.num_layers; ++l) {
    DeviceLayer& D = layers_[l];
    D.attn_norm = random.vector(hidden, 1.0f);
    D.mlp_norm = random.vector(hidden, 1.0f);
    if (s.qk_norm == QkNorm::kPerHead) {
      D.q_norm = random.vector(s.head_dim, 1.0f);
      D.k_norm = random.vector(s.head_dim, 1.0f);
    } else if (s.qk_norm == QkNorm::kWholeProjection) {
      D.q_norm = random.vector(s.q_dim(), 1.0f);
      D.k_norm = random.vector(s.kv_dim(), 1.0f);
    }
    if (s.qkv_bias) {
      D.q_bias = random.vector(s.q_dim(), 0.0f);
      D.k_bias = random.vector(s.kv_dim(), 0.0f);
      D.v_bias = random.vector(s.kv_dim(), 0.0f);
    }
    if (s.o_bias) D.o_bias = random.vector(hidden, 0.0f);
    D.qkv = random.matrix(s.q_dim() + 2 * s.kv_dim(), hidden);
    D.o = random.matrix(hidden, s.q_dim());
    if (s.layer_is_moe[l]) {
      D.router = random.random_f32(static_cast<size_t>(s.num_experts) * hidden);
      for (int e = 0; e < s.num_experts; ++e)
        D.experts.push_back(random.mlp(s.expert_intermediate, hidden));
      if (s.shared_intermediate > 0) {
        D.shared = random.mlp(s.shared_intermediate, hidden);
        if (s.shared_expert_gated) D.shared_gate = random.random_f32(hidden);
      }
    } else {
      D.dense = random.mlp(s.dense_intermediate, hidden);
    }
  }
  set_rope();
  set_expert_tables();
  EKVA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace ekva::cuda
