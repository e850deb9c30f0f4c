#include "model/model.h"

#include <fmt/format.h>

#include <system_error>

#include "core/error.h"
#include "io/model_config.h"

namespace ekva {
namespace {

class WeightReader {
 public:
  explicit WeightReader(const TensorStore& store) : store_(store) {}

  WeightMatrix matrix(const std::string& name, int rows, int cols) const {
    const TensorView& t = store_.get(name, {rows, cols});
    check_float(t);
    return WeightMatrix{t.dtype, t.data, rows, cols};
  }
  std::vector<float> vector(const std::string& name, int size) const {
    const TensorView& t = store_.get(name, {size});
    check_float(t);
    std::vector<float> v(size);
    to_f32(t.dtype, t.data, v.data(), size);
    return v;
  }
  bool has(const std::string& name) const { return store_.contains(name); }

 private:
  static void check_float(const TensorView& t) {
    if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
      fail(ErrorKind::kUnsupported, "tensor '{}' has dtype {}; weights must be F32, BF16 or F16",
           t.name, dtype_name(t.dtype));
    }
  }
  const TensorStore& store_;
};

Mlp read_mlp(const WeightReader& w, const std::string& prefix, const char* gate, const char* up,
             const char* down, int hidden, int inter) {
  return Mlp{w.matrix(prefix + gate + ".weight", inter, hidden),
             w.matrix(prefix + up + ".weight", inter, hidden),
             w.matrix(prefix + down + ".weight", hidden, inter)};
}

}  // namespace

Model::Model(const std::filesystem::path& dir, ModelSpec spec)
    : dir_(dir), spec_(std::move(spec)) {}

std::unique_ptr<Model> Model::without_weights(const ModelSpec& spec,
                                              const std::filesystem::path& source) {
  return std::unique_ptr<Model>(new Model(source, spec));
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    fail(ErrorKind::kIo, "{}: {}", dir.string(), ec.message());
  }
  if (!is_dir) fail(ErrorKind::kNotFound, "{}: not a model directory", dir.string());
  std::unique_ptr<Model> m(new Model(dir, load_model_config(dir)));
  const ModelSpec& s = m->spec_;
  m->store_.emplace(dir);
  const WeightReader w(*m->store_);
  const int h = s.hidden_size;
  m->embed_ = w.matrix("model.embed_tokens.weight", s.vocab_size, h);
  m->lm_head_ = s.tie_embeddings && !w.has("lm_head.weight")
                    ? m->embed_
                    : w.matrix("lm_head.weight", s.vocab_size, h);
  m->final_norm_ = w.vector("model.norm.weight", h);
  m->layers_.resize(s.num_layers);
  const bool mixtral = s.arch == Architecture::kMixtral;
  for (int l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = m->layers_[l];
    const std::string p = fmt::format("model.layers.{}.", l);
    L.attn_norm = w.vector(p + "input_layernorm.weight", h);
    L.mlp_norm = w.vector(p + "post_attention_layernorm.weight", h);
    L.q = w.matrix(p + "self_attn.q_proj.weight", s.q_dim(), h);
    L.k = w.matrix(p + "self_attn.k_proj.weight", s.kv_dim(), h);
    L.v = w.matrix(p + "self_attn.v_proj.weight", s.kv_dim(), h);
    L.o = w.matrix(p + "self_attn.o_proj.weight", h, s.q_dim());
    if (s.qkv_bias) {
      L.q_bias = w.vector(p + "self_attn.q_proj.bias", s.q_dim());
      L.k_bias = w.vector(p + "self_attn.k_proj.bias", s.kv_dim());
      L.v_bias = w.vector(p + "self_attn.v_proj.bias", s.kv_dim());
    }
    if (s.o_bias) L.o_bias = w.vector(p + "self_attn.o_proj.bias", h);
    if (s.qk_norm == QkNorm::kPerHead) {
      L.q_norm = w.vector(p + "self_attn.q_norm.weight", s.head_dim);
      L.k_norm = w.vector(p + "self_attn.k_norm.weight", s.head_dim);
    } else if (s.qk_norm == QkNorm::kWholeProjection) {
      L.q_norm = w.vector(p + "self_attn.q_norm.weight", s.q_dim());
      L.k_norm = w.vector(p + "self_attn.k_norm.weight", s.kv_dim());
    }
    if (!s.layer_is_moe[l]) {
      L.dense =
          read_mlp(w, p + "mlp.", "gate_proj", "up_proj", "down_proj", h, s.dense_intermediate);
      continue;
    }
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    L.router = w.matrix(moe + "gate.weight", s.num_experts, h);
    for (int e = 0; e < s.num_experts; ++e) {
      const std::string ep = fmt::format("{}experts.{}.", moe, e);
      L.experts.push_back(
          mixtral ? read_mlp(w, ep, "w1", "w3", "w2", h, s.expert_intermediate)
                  : read_mlp(w, ep, "gate_proj", "up_proj", "down_proj", h, s.expert_intermediate));
    }
    if (s.shared_intermediate > 0) {
      L.shared = read_mlp(w, moe + "shared_expert.", "gate_proj", "up_proj", "down_proj", h,
                          s.shared_intermediate);
      if (s.shared_expert_gated) L.shared_gate = w.matrix(moe + "shared_expert_gate.weight", 1, h);
    }
  }
  return m;
}

size_t Model::active_weight_bytes_per_token() const {
  if (!has_weights()) return 0;
  size_t bytes = lm_head_.bytes() + embed_.bytes() / static_cast<size_t>(spec_.vocab_size);
  auto mlp_bytes = [](const Mlp& m) { return m.gate.bytes() + m.up.bytes() + m.down.bytes(); };
  for (int l = 0; l < spec_.num_layers; ++l) {
    const LayerWeights& L = layers_[l];
    bytes += L.q.bytes() + L.k.bytes() + L.v.bytes() + L.o.bytes();
    if (!spec_.layer_is_moe[l]) {
      bytes += mlp_bytes(L.dense);
      continue;
    }
    bytes += L.router.bytes() + spec_.top_k * mlp_bytes(L.experts[0]);
    if (spec_.shared_intermediate > 0) bytes += mlp_bytes(L.shared) + L.shared_gate.bytes();
  }
  return bytes;
}

}  // namespace ekva
