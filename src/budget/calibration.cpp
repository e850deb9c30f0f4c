#include "budget/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/loss.h"
#include "io/json_file.h"
#include "io/model_limits.h"

namespace ekva {
namespace {

using nlohmann::json;

// Budgets as fractions of the keys a query sees; the plan interpolates between them.
const std::vector<double> kGrid = {0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0};

class StatsObserver : public ForwardObserver {
 public:
  StatsObserver(const ModelSpec& spec, const CalibrationOptions& options, CalibrationStats& stats)
      : spec_(spec), options_(options), stats_(stats) {}

  bool reads_kv() const override { return true; }
  bool reads_expert_outputs() const override { return true; }

  void on_expert_output(int layer, int expert, const std::vector<int32_t>& rows,
                        const std::vector<float>& gates, const float* y, int hidden) override {
    double sum = 0.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      double ss = 0.0;
      for (int j = 0; j < hidden; ++j)
        ss += static_cast<double>(y[i * hidden + j]) * y[i * hidden + j];
      sum += gates[i] * std::sqrt(ss);
    }
    stats_.output_norm[stats_.le(layer, expert)] += sum;
  }

  void on_layer_routed(int layer, const ForwardBatch& batch, const KvLayout& layout,
                       const KvPages* pages, const float* q, const int32_t* experts,
                       const float* gates, int top_k) override {
    const int E = spec_.num_experts, n = batch.size();
    for (int t = 0; t < n; ++t) {
      const int32_t* ex = experts + static_cast<size_t>(t) * top_k;
      stats_.routing_primary[stats_.le(layer, ex[0])] += 1;
      for (int i = 0; i < top_k; ++i) {
        stats_.routing_topk[stats_.le(layer, ex[i])] += 1;
        stats_.gate_mass[stats_.le(layer, ex[i])] += gates[static_cast<size_t>(t) * top_k + i];
        for (int j = i + 1; j < top_k; ++j) {
          stats_.coroute[(static_cast<size_t>(layer) * E + ex[i]) * E + ex[j]] += 1;
          stats_.coroute[(static_cast<size_t>(layer) * E + ex[j]) * E + ex[i]] += 1;
        }
      }
    }
    if (pages == nullptr) {
      fail(ErrorKind::kUnsupported,
           "calibration recomputes attention from host K/V pages; run it on the CPU backend");
    }
    attention_stats(layer, batch, layout, *pages, q, experts, top_k);
  }

 private:
  // Recomputes the attention of the observation queries now that every key's expert is known.
  void attention_stats(int layer, const ForwardBatch& batch, const KvLayout& layout,
                       const KvPages& pages, const float* q, const int32_t* experts, int top_k) {
    const int H = spec_.num_kv_heads, group = spec_.num_heads / H, d = spec_.head_dim,
              E = spec_.num_experts;
#pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < H; ++h) {
      std::vector<float> w, p;
      std::vector<std::vector<float>> by_expert(E);
      for (int t = 0; t < batch.size(); t += options_.query_stride) {
        const HeadTable& table = layout.table(batch.seq[t], layer, h);
        const int len = table.size();
        int visible = 0;
        for (int i = 0; i < len; ++i) visible += table.meta[i].position <= batch.pos[t] ? 1 : 0;
        if (visible < options_.min_keys) continue;
        w.assign(len, 0.0f);
        p.resize(len);
        double entropy = 0.0;
        for (int qh = h * group; qh < (h + 1) * group; ++qh) {
          cpu::attention_weights(pages, table,
                                 q + (static_cast<size_t>(t) * spec_.num_heads + qh) * d,
                                 batch.pos[t], p.data());
          for (int i = 0; i < len; ++i) {
            const double pi = p[i];
            if (pi > 0) entropy -= pi * std::log(pi);
            w[i] += static_cast<float>(pi / group);
          }
        }
        const int expert_t = experts[static_cast<size_t>(t) * top_k];
        stats_.entropy_sum[stats_.lhe(layer, h, expert_t)] += entropy / group;
        stats_.entropy_count[stats_.lhe(layer, h, expert_t)] += 1;
        for (auto& v : by_expert) v.clear();
        for (int i = 0; i < len; ++i) {
          if (table.meta[i].position <= batch.pos[t] && table.meta[i].expert >= 0) {
            by_expert[table.meta[i].expert].push_back(w[i]);
          }
        }
        for (int e = 0; e < E; ++e) {
          auto& v = by_expert[e];
          stats_.key_share_sum[stats_.lhe(layer, h, e)] += static_cast<double>(v.size()) / visible;
          std::sort(v.begin(), v.end(), std::greater<>());
          double cum = 0.0;
          size_t taken = 0;
          for (size_t g = 0; g < kGrid.size(); ++g) {
            const size_t b =
                std::min(v.size(), static_cast<size_t>(std::lround(kGrid[g] * visible)));
            for (; taken < b; ++taken) cum += v[taken];
            stats_.retention_sum[stats_.lhe(layer, h, e) * kGrid.size() + g] += cum;
          }
        }
        stats_.queries[static_cast<size_t>(layer) * H + h] += 1;
      }
    }
  }

  const ModelSpec& spec_;
  const CalibrationOptions& options_;
  CalibrationStats& stats_;
};

// Every position's logits of one chunk, prefilled from position 0 with full KV.
std::vector<float> run_chunk(const Model& model, const EngineOptions& options,
                             const std::vector<int32_t>& chunk, ForwardObserver* observer,
                             int disabled_layer = -1, int disabled_expert = -1) {
  Engine engine(model, options);
  engine.backend().disable_expert(disabled_layer, disabled_expert);
  return engine.prefill(0, chunk, /*all_logits=*/true, observer);
}

}  // namespace

double CalibrationStats::retention(int l, int h, int e, size_t g) const {
  const double q = queries[static_cast<size_t>(l) * num_kv_heads + h];
  return q > 0 ? retention_sum[lhe(l, h, e) * grid.size() + g] / q : 0.0;
}

double CalibrationStats::mean_entropy(int l, int h, int e) const {
  const double c = entropy_count[lhe(l, h, e)];
  return c > 0 ? entropy_sum[lhe(l, h, e)] / c : 0.0;
}

double CalibrationStats::key_share(int l, int h, int e) const {
  const double q = queries[static_cast<size_t>(l) * num_kv_heads + h];
  return q > 0 ? key_share_sum[lhe(l, h, e)] / q : 0.0;
}

std::vector<std::vector<int32_t>> calibration_chunks(const std::vector<int32_t>& ids,
                                                     int chunk_tokens, int64_t max_tokens) {
  if (chunk_tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "calibration chunks of {} tokens", chunk_tokens);
  }
  const size_t chunk = static_cast<size_t>(chunk_tokens);
  const size_t limit = static_cast<size_t>(std::max<int64_t>(max_tokens, 0));
  std::vector<std::vector<int32_t>> chunks;
  for (size_t i = 0; i + chunk <= ids.size() && i + chunk <= limit; i += chunk) {
    chunks.emplace_back(ids.begin() + static_cast<ptrdiff_t>(i),
                        ids.begin() + static_cast<ptrdiff_t>(i + chunk));
  }
  if (chunks.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "calibration: {} tokens (at most {} used) hold no chunk of {} tokens", ids.size(),
         max_tokens, chunk_tokens);
  }
  return chunks;
}

CalibrationStats calibrate(const Model& model, const std::vector<std::vector<int32_t>>& chunks,
                           const CalibrationOptions& options, const CalibrationProgress& progress) {
  const ModelSpec& s = model.spec();
  if (chunks.empty())
    fail(ErrorKind::kInvalidArgument, "calibration needs at least one chunk of tokens");
  if (options.query_stride < 1 || options.min_keys < 1) {
    fail(ErrorKind::kInvalidArgument, "calibration: query stride and min keys must be >= 1");
  }
  CalibrationStats st;
  st.model_type = s.model_type;
  st.num_layers = s.num_layers;
  st.num_kv_heads = s.num_kv_heads;
  st.num_experts = s.num_experts;
  st.grid = kGrid;
  st.chunk_tokens = options.chunk_tokens;
  const size_t LE = static_cast<size_t>(s.num_layers) * s.num_experts;
  const size_t LHE = LE * s.num_kv_heads;
  for (auto* v : {&st.routing_primary, &st.routing_topk, &st.gate_mass, &st.output_norm})
    v->assign(LE, 0.0);
  st.coroute.assign(LE * s.num_experts, 0.0);
  for (auto* v : {&st.entropy_sum, &st.entropy_count, &st.key_share_sum}) v->assign(LHE, 0.0);
  st.retention_sum.assign(LHE * kGrid.size(), 0.0);
  st.queries.assign(static_cast<size_t>(s.num_layers) * s.num_kv_heads, 0.0);
  for (int l = 0; l < s.num_layers; ++l) st.moe.push_back(s.layer_is_moe[l] ? 1 : 0);

  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  StatsObserver observer(s, options, st);
  double loss = 0.0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (static_cast<int64_t>(chunks[c].size()) > s.max_position) {
      fail(ErrorKind::kInvalidArgument,
           "calibration chunk of {} tokens exceeds the model's context of {}", chunks[c].size(),
           s.max_position);
    }
    loss += next_token_loss(run_chunk(model, options.engine, chunks[c], &observer), chunks[c],
                            s.vocab_size);
    st.tokens += static_cast<int64_t>(chunks[c].size());
    if (progress) progress(static_cast<int>(c + 1), static_cast<int>(chunks.size()), "statistics");
  }
  st.chunks = static_cast<int>(chunks.size());
  st.base_loss = loss / chunks.size();
  st.stats_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (size_t i = 0; i < LE; ++i)
    st.output_norm[i] = st.routing_topk[i] > 0 ? st.output_norm[i] / st.routing_topk[i] : 0.0;

  if (options.ablation) {
    t0 = Clock::now();
    st.loss_contribution.assign(LE, 0.0);
    const int passes = s.num_moe_layers() * s.num_experts;
    int done = 0;
    for (int l = 0; l < s.num_layers; ++l) {
      if (!s.layer_is_moe[l]) continue;
      for (int e = 0; e < s.num_experts; ++e) {
        double ablated = 0.0;
        for (const auto& chunk : chunks)
          ablated += next_token_loss(run_chunk(model, options.engine, chunk, nullptr, l, e), chunk,
                                     s.vocab_size);
        st.loss_contribution[st.le(l, e)] = ablated / chunks.size() - st.base_loss;
        if (progress) progress(++done, passes, "ablation");
      }
    }
    st.ablation_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return st;
}

json CalibrationStats::to_json() const {
  return {{"format", "ekva.calibration_stats"},
          {"version", kVersion},
          {"model",
           {{"model_type", model_type},
            {"num_layers", num_layers},
            {"num_kv_heads", num_kv_heads},
            {"num_experts", num_experts}}},
          {"grid", grid},
          {"tokens", tokens},
          {"chunks", chunks},
          {"chunk_tokens", chunk_tokens},
          {"base_loss", base_loss},
          {"stats_seconds", stats_seconds},
          {"ablation_seconds", ablation_seconds},
          {"moe", moe},
          {"routing_primary", routing_primary},
          {"routing_topk", routing_topk},
          {"gate_mass", gate_mass},
          {"output_norm", output_norm},
          {"loss_contribution", loss_contribution},
          {"coroute", coroute},
          {"entropy_sum", entropy_sum},
          {"entropy_count", entropy_count},
          {"key_share_sum", key_share_sum},
          {"retention_sum", retention_sum},
          {"queries", queries}};
}

CalibrationStats CalibrationStats::from_json(const json& j, const std::string& source) {
  try {
    if (j.at("format") != "ekva.calibration_stats") {
      fail(ErrorKind::kInvalidFile, "{}: format is not 'ekva.calibration_stats'", source);
    }
    // Integers are bounded before anything is sized from them, and never narrowed silently.
    const auto integer = [&](const json& parent, const char* key, int64_t min, int64_t max) {
      const json& v = parent.at(key);
      if (!json_integer_in(v, min, max)) {
        fail(ErrorKind::kInvalidFile, "{}: '{}' must be an integer in [{}, {}], got {}", source,
             key, min, max, json_excerpt(v));
      }
      return v.get<int64_t>();
    };
    constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
    const int64_t version = integer(j, "version", 0, kMaxInt);
    if (version != kVersion) {
      fail(ErrorKind::kUnsupported, "{}: calibration stats version {} (this build reads {})",
           source, version, kVersion);
    }
    CalibrationStats s;
    const json& m = j.at("model");
    s.model_type = m.at("model_type").get<std::string>();
    s.num_layers = integer(m, "num_layers", 1, model_limits::kLayers);
    s.num_kv_heads = integer(m, "num_kv_heads", 1, model_limits::kHeads);
    s.num_experts = integer(m, "num_experts", 1, model_limits::kExperts);
    s.grid = j.at("grid").get<std::vector<double>>();
    for (const double g : s.grid) {
      if (!(g > 0) || g > 1)
        fail(ErrorKind::kInvalidFile, "{}: grid value {} is not in (0, 1]", source, g);
    }
    s.tokens = integer(j, "tokens", 0, std::numeric_limits<int64_t>::max());
    s.chunks = integer(j, "chunks", 0, kMaxInt);
    s.chunk_tokens = integer(j, "chunk_tokens", 0, kMaxInt);
    s.base_loss = j.at("base_loss").get<double>();
    s.stats_seconds = j.at("stats_seconds").get<double>();
    s.ablation_seconds = j.at("ablation_seconds").get<double>();
    const json& moe = j.at("moe");
    if (!moe.is_array()) fail(ErrorKind::kInvalidFile, "{}: 'moe' must be an array", source);
    for (const json& flag : moe) {
      if (!json_integer_in(flag, 0, 1)) {
        fail(ErrorKind::kInvalidFile, "{}: 'moe' entries must be 0 or 1, got {}", source,
             json_excerpt(flag));
      }
      s.moe.push_back(static_cast<uint8_t>(flag.get<int64_t>()));
    }
    const size_t LE = static_cast<size_t>(s.num_layers) * s.num_experts, LHE = LE * s.num_kv_heads;
    auto vec = [&](const char* key, size_t size, bool optional = false) {
      auto v = j.at(key).get<std::vector<double>>();
      if (v.size() != size && !(optional && v.empty())) {
        fail(ErrorKind::kInvalidFile, "{}: '{}' has {} entries, the model shape needs {}", source,
             key, v.size(), size);
      }
      return v;
    };
    s.routing_primary = vec("routing_primary", LE);
    s.routing_topk = vec("routing_topk", LE);
    s.gate_mass = vec("gate_mass", LE);
    s.output_norm = vec("output_norm", LE);
    s.loss_contribution = vec("loss_contribution", LE, true);
    s.coroute = vec("coroute", LE * s.num_experts);
    s.entropy_sum = vec("entropy_sum", LHE);
    s.entropy_count = vec("entropy_count", LHE);
    s.key_share_sum = vec("key_share_sum", LHE);
    s.retention_sum = vec("retention_sum", LHE * s.grid.size());
    s.queries = vec("queries", static_cast<size_t>(s.num_layers) * s.num_kv_heads);
    if (s.moe.size() != static_cast<size_t>(s.num_layers))
      fail(ErrorKind::kInvalidFile, "{}: 'moe' must list every layer", source);
    // Sums over tokens and queries are finite and not negative (a loss contribution may be
    // negative); a query's retained mass and key share are at most 1, so their sums are at most
    // the query count.
    const auto finite = [&](const char* key, const std::vector<double>& v, bool signed_values) {
      for (size_t i = 0; i < v.size(); ++i) {
        if (!std::isfinite(v[i]) || (!signed_values && v[i] < 0)) {
          fail(ErrorKind::kInvalidFile, "{}: {}[{}] is {}; it must be finite{}", source, key, i,
               v[i], signed_values ? "" : " and not negative");
        }
      }
    };
    finite("routing_primary", s.routing_primary, false);
    finite("routing_topk", s.routing_topk, false);
    finite("gate_mass", s.gate_mass, false);
    finite("output_norm", s.output_norm, false);
    finite("loss_contribution", s.loss_contribution, true);
    finite("coroute", s.coroute, false);
    finite("entropy_sum", s.entropy_sum, false);
    finite("entropy_count", s.entropy_count, false);
    finite("key_share_sum", s.key_share_sum, false);
    finite("retention_sum", s.retention_sum, false);
    finite("queries", s.queries, false);
    if (!std::isfinite(s.base_loss))
      fail(ErrorKind::kInvalidFile, "{}: base_loss is not finite", source);
    for (int l = 0; l < s.num_layers; ++l) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        const double queries = s.queries[static_cast<size_t>(l) * s.num_kv_heads + h];
        const double most = queries * (1 + 1e-6) + 1e-6;
        for (int e = 0; e < s.num_experts; ++e) {
          bool over = s.key_share_sum[s.lhe(l, h, e)] > most;
          for (size_t g = 0; g < s.grid.size(); ++g) {
            over = over || s.retention_sum[s.lhe(l, h, e) * s.grid.size() + g] > most;
          }
          if (over) {
            fail(ErrorKind::kInvalidFile,
                 "{}: layer {} KV head {} expert {} holds more attention than its {} queries saw",
                 source, l, h, e, queries);
          }
        }
      }
    }
    return s;
  } catch (const json::exception& e) {
    fail(ErrorKind::kInvalidFile, "{}: malformed calibration stats: {}", source, e.what());
  }
}

CalibrationStats CalibrationStats::load(const std::filesystem::path& path) {
  return from_json(read_json_file(path), path.string());
}

void CalibrationStats::save(const std::filesystem::path& path) const {
  write_text_file(path, to_json().dump() + "\n");
}

void CalibrationStats::check_model(const ModelSpec& spec) const {
  if (spec.model_type != model_type || spec.num_layers != num_layers ||
      spec.num_kv_heads != num_kv_heads || spec.num_experts != num_experts) {
    fail(ErrorKind::kInvalidArgument,
         "calibration stats are for a {} model with {} layers, {} KV heads and {} experts, not "
         "this {} model",
         model_type, num_layers, num_kv_heads, num_experts, spec.model_type);
  }
}

}  // namespace ekva
