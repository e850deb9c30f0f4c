#include "io/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "io/json_file.h"
#include "io/model_limits.h"

namespace ekva {
namespace {

using nlohmann::json;

using model_limits::kExperts;
using model_limits::kHeadDim;
using model_limits::kHeads;
using model_limits::kHidden;
using model_limits::kIntermediate;
using model_limits::kLayers;
using model_limits::kVocab;
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

class ConfigReader {
 public:
  ConfigReader(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  // An integer field in [min, max]; values are never narrowed silently.
  int integer(const char* key, int64_t min, int64_t max) const {
    if (!has(key)) fail(ErrorKind::kInvalidFile, "{}: missing field '{}'", source_, key);
    return integer_value(key, j_[key], min, max);
  }
  int integer_or(const char* key, int64_t min, int64_t max, int fallback) const {
    return has(key) ? integer_value(key, j_[key], min, max) : fallback;
  }
  // A finite number above `above`.
  double number_or(const char* key, double above, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > above)) {
      fail(ErrorKind::kInvalidFile, "{}: field '{}' must be a finite number above {}, got {}",
           source_, key, above, json_excerpt(v));
    }
    return v.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean())
      fail(ErrorKind::kInvalidFile, "{}: field '{}' is not a boolean", source_, key);
    return j_[key].get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string())
      fail(ErrorKind::kInvalidFile, "{}: field '{}' is not a string", source_, key);
    return j_[key].get<std::string>();
  }
  // The integers of a field that holds one integer or a list of them.
  std::vector<int> integers(const char* key, int64_t min, int64_t max) const {
    if (!has(key)) return {};
    const json& v = j_[key];
    if (!v.is_array()) return {integer_value(key, v, min, max)};
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i) {
      out.push_back(integer_value(fmt::format("{}[{}]", key, i).c_str(), v[i], min, max));
    }
    return out;
  }
  // A nested object such as rope_scaling.
  const json& object(const char* key) const {
    if (!j_[key].is_object())
      fail(ErrorKind::kInvalidFile, "{}: field '{}' is not an object", source_, key);
    return j_[key];
  }
  const std::string& source() const { return source_; }

 private:
  int integer_value(const char* key, const json& v, int64_t min, int64_t max) const {
    if (!v.is_number_integer())
      fail(ErrorKind::kInvalidFile, "{}: field '{}' is not an integer", source_, key);
    if (!json_integer_in(v, min, max)) {
      fail(ErrorKind::kInvalidFile, "{}: field '{}' must be in [{}, {}], got {}", source_, key, min,
           max, json_excerpt(v));
    }
    return static_cast<int>(v.get<int64_t>());
  }
  const json& j_;
  const std::string& source_;
};

Architecture parse_architecture(const ConfigReader& c) {
  const std::string type = c.string_or("model_type", "");
  if (type == "mixtral") return Architecture::kMixtral;
  if (type == "qwen2_moe") return Architecture::kQwen2Moe;
  if (type == "qwen3_moe") return Architecture::kQwen3Moe;
  if (type == "olmoe") return Architecture::kOlmoe;
  fail(ErrorKind::kUnsupported,
       "{}: unsupported architecture model_type='{}' (supported: mixtral, qwen2_moe, qwen3_moe, "
       "olmoe)",
       c.source(), type);
}

RopeSpec parse_rope(const ConfigReader& c) {
  // transformers 5 keeps theta and scaling in rope_parameters; older configs use rope_theta and
  // rope_scaling at the top level.
  json params = json::object();
  if (c.has("rope_parameters")) params = c.object("rope_parameters");
  if (c.has("rope_scaling")) {
    for (const auto& [k, v] : c.object("rope_scaling").items()) params[k] = v;
  }
  if (!params.contains("rope_theta") && c.has("rope_theta")) {
    params["rope_theta"] = c.number_or("rope_theta", 0.0, 0.0);
  }
  const std::string where = c.source() + " rope parameters";
  ConfigReader r(params, where);
  RopeSpec rope;
  rope.theta = r.number_or("rope_theta", 0.0, 10000.0);
  std::string type = r.string_or("rope_type", r.string_or("type", "default"));
  if (type == "default") return rope;
  rope.factor = r.number_or("factor", 0.0, 1.0);
  if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    rope.low_freq_factor = r.number_or("low_freq_factor", 0.0, 1.0);
    rope.high_freq_factor = r.number_or("high_freq_factor", 0.0, 4.0);
    if (rope.high_freq_factor <= rope.low_freq_factor) {
      fail(ErrorKind::kInvalidFile, "{}: high_freq_factor {} must exceed low_freq_factor {}", where,
           rope.high_freq_factor, rope.low_freq_factor);
    }
    rope.original_max_position = r.integer("original_max_position_embeddings", 1, kMaxInt);
  } else if (type == "yarn") {
    rope.scaling = RopeScaling::kYarn;
    rope.beta_fast = r.number_or("beta_fast", 0.0, 32.0);
    rope.beta_slow = r.number_or("beta_slow", 0.0, 1.0);
    rope.original_max_position =
        r.integer_or("original_max_position_embeddings", 1, kMaxInt,
                     c.integer_or("max_position_embeddings", 1, kMaxInt, 0));
    rope.attention_factor = r.number_or("attention_factor", 0.0,
                                        rope.factor <= 1 ? 1.0 : 0.1 * std::log(rope.factor) + 1.0);
  } else {
    fail(ErrorKind::kUnsupported,
         "{}: rope_type '{}' is not supported (default, linear, llama3, yarn)", where, type);
  }
  return rope;
}

}  // namespace

ModelSpec parse_model_config(const json& config, const std::string& source) {
  if (!config.is_object()) fail(ErrorKind::kInvalidFile, "{}: not a JSON object", source);
  ConfigReader c(config, source);
  ModelSpec s;
  s.arch = parse_architecture(c);
  s.model_type = architecture_name(s.arch);
  s.hidden_size = c.integer("hidden_size", 1, kHidden);
  s.num_layers = c.integer("num_hidden_layers", 1, kLayers);
  s.num_heads = c.integer("num_attention_heads", 1, kHeads);
  s.num_kv_heads = c.integer_or("num_key_value_heads", 1, kHeads, s.num_heads);
  if (s.num_heads % s.num_kv_heads != 0) {
    fail(ErrorKind::kInvalidFile,
         "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
         s.num_heads, s.num_kv_heads);
  }
  s.head_dim = c.integer_or("head_dim", 1, kHeadDim, s.hidden_size / s.num_heads);
  if (s.head_dim <= 0 || s.head_dim % 2 != 0) {
    fail(ErrorKind::kInvalidFile, "{}: head_dim {} must be positive and even", source, s.head_dim);
  }
  s.vocab_size = c.integer("vocab_size", 1, kVocab);
  s.max_position = c.integer("max_position_embeddings", 1, kMaxInt);
  s.rms_eps = c.number_or("rms_norm_eps", 0.0, 1e-6);
  s.tie_embeddings = c.boolean_or("tie_word_embeddings", false);
  s.rope = parse_rope(c);
  if (c.has("partial_rotary_factor") && c.number_or("partial_rotary_factor", 0.0, 1.0) != 1.0) {
    fail(ErrorKind::kUnsupported, "{}: partial_rotary_factor != 1 is not supported", source);
  }
  const std::string act = c.string_or("hidden_act", "silu");
  if (act != "silu") fail(ErrorKind::kUnsupported, "{}: hidden_act '{}' (only silu)", source, act);

  const std::string dtype = c.string_or("dtype", c.string_or("torch_dtype", "float32"));
  if (dtype == "bfloat16") {
    s.weight_dtype = DType::kBF16;
  } else if (dtype == "float16") {
    s.weight_dtype = DType::kF16;
  } else if (dtype == "float32") {
    s.weight_dtype = DType::kF32;
  } else {
    fail(ErrorKind::kUnsupported, "{}: dtype '{}' (supported: float32, bfloat16, float16)", source,
         dtype);
  }

  // Tiny test checkpoints keep their parent's special ids beyond their vocabulary.
  if (c.has("bos_token_id")) s.bos_id = c.integer("bos_token_id", 0, kMaxInt);
  s.eos_ids = c.integers("eos_token_id", 0, kMaxInt);

  s.num_experts = c.has("num_local_experts") ? c.integer("num_local_experts", 1, kExperts)
                                             : c.integer("num_experts", 1, kExperts);
  s.top_k = c.integer("num_experts_per_tok", 1, kExperts);
  if (s.top_k > s.num_experts) {
    fail(ErrorKind::kInvalidFile, "{}: num_experts_per_tok {} exceeds the {} experts", source,
         s.top_k, s.num_experts);
  }
  s.layer_is_moe.assign(s.num_layers, true);
  switch (s.arch) {
    case Architecture::kMixtral:
      s.norm_topk_prob = true;  // Mixtral always renormalises its top-k gates
      s.expert_intermediate = c.integer("intermediate_size", 1, kIntermediate);
      break;
    case Architecture::kQwen2Moe:
    case Architecture::kQwen3Moe: {
      s.norm_topk_prob = c.boolean_or("norm_topk_prob", s.arch == Architecture::kQwen3Moe);
      s.expert_intermediate = c.integer("moe_intermediate_size", 1, kIntermediate);
      s.dense_intermediate = c.integer_or("intermediate_size", 0, kIntermediate, 0);
      const int step = c.integer_or("decoder_sparse_step", 0, kMaxInt, 1);
      const std::vector<int> mlp_only = c.integers("mlp_only_layers", 0, kMaxInt);
      for (int l = 0; l < s.num_layers; ++l) {
        const bool listed = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
        s.layer_is_moe[l] = !listed && step > 0 && (l + 1) % step == 0;
        if (!s.layer_is_moe[l] && s.dense_intermediate <= 0) {
          fail(ErrorKind::kInvalidFile, "{}: layer {} is dense but intermediate_size is missing",
               source, l);
        }
      }
      if (s.arch == Architecture::kQwen2Moe) {
        s.qkv_bias = c.boolean_or("qkv_bias", true);
        s.shared_intermediate =
            c.integer_or("shared_expert_intermediate_size", 0, kIntermediate, 0);
        s.shared_expert_gated = s.shared_intermediate > 0;
      } else {
        s.qkv_bias = c.boolean_or("attention_bias", false);
        s.o_bias = s.qkv_bias;
        s.qk_norm = QkNorm::kPerHead;
      }
      if (c.boolean_or("use_sliding_window", false)) {
        fail(ErrorKind::kUnsupported, "{}: use_sliding_window is not supported", source);
      }
      break;
    }
    case Architecture::kOlmoe:
      s.norm_topk_prob = c.boolean_or("norm_topk_prob", false);
      s.expert_intermediate = c.integer("intermediate_size", 1, kIntermediate);
      s.qkv_bias = c.boolean_or("attention_bias", false);
      s.o_bias = s.qkv_bias;
      s.qk_norm = QkNorm::kWholeProjection;
      if (c.has("clip_qkv")) s.clip_qkv = static_cast<float>(c.number_or("clip_qkv", 0.0, 0.0));
      break;
  }
  if (s.arch == Architecture::kMixtral && c.has("sliding_window")) {
    fail(ErrorKind::kUnsupported, "{}: sliding_window attention is not supported", source);
  }
  return s;
}

ModelSpec load_model_config(const std::filesystem::path& dir_or_file) {
  std::error_code ec;
  const auto path =
      std::filesystem::is_directory(dir_or_file, ec) ? dir_or_file / "config.json" : dir_or_file;
  return parse_model_config(read_json_file(path), path.string());
}

}  // namespace ekva
