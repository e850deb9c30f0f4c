#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva::cpu {
namespace {

// Before the pages are allocated: a model without host weights cannot run here.
const Model* with_weights(const Model& model) {
  if (!model.has_weights()) {
    fail(ErrorKind::kUnsupported,
         "{}: the model's weights are not on the host (seeded random weights live on the GPU); "
         "the CPU backend cannot run it",
         model.dir().string());
  }
  return &model;
}

}  // namespace

CpuBackend::CpuBackend(const Model& model, const KvLayout& layout)
    : model_(with_weights(model)), rope_(model.spec().rope, model.spec().head_dim), pages_(layout) {
  const ModelSpec& s = model.spec();
  if (s.num_experts > 0) router_.emplace(s.num_experts, s.top_k, s.norm_topk_prob);
}

void CpuBackend::attention_block(int layer, const StepPlan& plan, KvLayout& layout, const float* x,
                                 float* out) {
  const ForwardBatch& batch = plan.batch;
  const ModelSpec& s = model_->spec();
  const LayerWeights& L = model_->layer(layer);
  const int n = batch.size();
  const int d = s.head_dim;
  std::vector<float>& q = q_;
  q.resize(static_cast<size_t>(n) * s.q_dim());
  std::vector<float> k(static_cast<size_t>(n) * s.kv_dim()), v(static_cast<size_t>(n) * s.kv_dim());
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  const Product qkv[] = {{&L.q, x, n, q.data(), bias(L.q_bias)},
                         {&L.k, x, n, k.data(), bias(L.k_bias)},
                         {&L.v, x, n, v.data(), bias(L.v_bias)}};
  linear(qkv);
  if (s.qk_norm == QkNorm::kPerHead) {
    rms_norm(q.data(), n * s.num_heads, d, L.q_norm.data(), s.rms_eps);
    rms_norm(k.data(), n * s.num_kv_heads, d, L.k_norm.data(), s.rms_eps);
  } else if (s.qk_norm == QkNorm::kWholeProjection) {
    rms_norm(q.data(), n, s.q_dim(), L.q_norm.data(), s.rms_eps);
    rms_norm(k.data(), n, s.kv_dim(), L.k_norm.data(), s.rms_eps);
  }
  if (s.clip_qkv) {
    const float c = *s.clip_qkv;
    for (auto* buf : {&q, &k, &v}) {
      for (float& e : *buf) e = std::clamp(e, -c, c);
    }
  }
  rope_.apply(q.data(), n, s.num_heads, batch.pos.data());
  rope_.apply(k.data(), n, s.num_kv_heads, batch.pos.data());
  pages_.reserve(layout);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const size_t off = static_cast<size_t>(t) * s.kv_dim() + static_cast<size_t>(h) * d;
      const HeadTable& table = layout.table(batch.seq[t], layer, h);
      pages_.write(layout.address(table, plan.slot(layer, t, h)), k.data() + off, v.data() + off);
    }
  }
  std::vector<float> attn(static_cast<size_t>(n) * s.q_dim());
  attention(layout, pages_, layer, q.data(), batch.seq.data(), batch.pos.data(), n, s.num_heads,
            attn.data(), batch.score_query.empty() ? nullptr : batch.score_query.data());
  linear(L.o, attn.data(), n, out, bias(L.o_bias));
}

namespace {

// An MLP over some rows of the layer's input: y = mlp(x[r]) for each listed row r.
struct MlpRows {
  const Mlp* mlp;
  const std::vector<int32_t>* rows;
  std::vector<float> y;  // rows->size() x hidden
};

// Runs several MLPs over their rows of x. Those of few rows (decode) have their products batched,
// every gate and up product in one cpu::linear call, then every down product; those of many rows
// (prefill) run one after the other, so that each one's activations stay in cache.
void run_mlps(std::vector<MlpRows>& jobs, const float* x, int hidden) {
  const auto run = [&](const std::vector<MlpRows*>& batch) {
    const size_t count = batch.size();
    std::vector<std::vector<float>> xs(count), g(count), u(count);
    std::vector<Product> products;
    for (size_t j = 0; j < count; ++j) {
      const std::vector<int32_t>& rows = *batch[j]->rows;
      const int n = static_cast<int>(rows.size());
      const int inter = batch[j]->mlp->gate.rows;
      xs[j].resize(static_cast<size_t>(n) * hidden);
      for (int i = 0; i < n; ++i) {
        std::copy_n(x + static_cast<size_t>(rows[i]) * hidden, hidden,
                    xs[j].data() + static_cast<size_t>(i) * hidden);
      }
      g[j].resize(static_cast<size_t>(n) * inter);
      u[j].resize(g[j].size());
      products.push_back({&batch[j]->mlp->gate, xs[j].data(), n, g[j].data()});
      products.push_back({&batch[j]->mlp->up, xs[j].data(), n, u[j].data()});
    }
    linear(products);
    products.clear();
    for (size_t j = 0; j < count; ++j) {
      const int n = static_cast<int>(batch[j]->rows->size());
      silu_mul(g[j].data(), u[j].data(), g[j].data(), g[j].size());
      batch[j]->y.resize(static_cast<size_t>(n) * hidden);
      products.push_back({&batch[j]->mlp->down, g[j].data(), n, batch[j]->y.data()});
    }
    linear(products);
  };
  std::vector<MlpRows*> few;
  for (MlpRows& job : jobs) {
    if (job.rows->size() <= static_cast<size_t>(kStreamedRows)) {
      few.push_back(&job);
    } else {
      run({&job});
    }
  }
  if (!few.empty()) run(few);
}

// out[r] += weight * y for each listed row r.
void accumulate_rows(const std::vector<float>& y, int hidden, const std::vector<int32_t>& rows,
                     const std::vector<float>& weights, float* out) {
  for (size_t i = 0; i < rows.size(); ++i) {
    float* o = out + static_cast<size_t>(rows[i]) * hidden;
    const float* yr = y.data() + i * hidden;
    for (int j = 0; j < hidden; ++j) o[j] += weights[i] * yr[j];
  }
}

}  // namespace

void CpuBackend::moe_block(int layer, int moe_index, const StepPlan& plan, KvLayout& layout,
                           const float* x, float* out, ForwardObserver* observer) {
  const ForwardBatch& batch = plan.batch;
  const ModelSpec& s = model_->spec();
  const int n = batch.size();
  const LayerWeights& L = model_->layer(layer);
  const int hidden = s.hidden_size;
  std::fill(out, out + static_cast<size_t>(n) * hidden, 0.0f);
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  if (!s.layer_is_moe[layer]) {
    std::vector<MlpRows> dense = {{&L.dense, &all, {}}};
    run_mlps(dense, x, hidden);
    accumulate_rows(dense[0].y, hidden, all, std::vector<float>(n, 1.0f), out);
    return;
  }
  const int E = s.num_experts;
  std::vector<float> logits(static_cast<size_t>(n) * E);
  linear(L.router, x, n, logits.data());
  if (observer != nullptr) observer->on_router_logits(layer, moe_index, logits.data(), n, E);

  std::vector<std::vector<int32_t>> rows(E);
  std::vector<std::vector<float>> gates(E);
  std::vector<int32_t> top_experts(static_cast<size_t>(n) * s.top_k);
  std::vector<float> top_gates(top_experts.size());
  for (int t = 0; t < n; ++t) {
    int32_t* experts = top_experts.data() + static_cast<size_t>(t) * s.top_k;
    float* g = top_gates.data() + static_cast<size_t>(t) * s.top_k;
    router_->route(logits.data() + static_cast<size_t>(t) * E, experts, g);
    for (int i = 0; i < s.top_k; ++i) {
      rows[experts[i]].push_back(t);
      gates[experts[i]].push_back(g[i]);
    }
    // The token's KV entries at this layer learn its routing now that the router has run.
    for (int h = 0; h < s.num_kv_heads; ++h) {
      layout.table(batch.seq[t], layer, h).meta[plan.slot(layer, t, h)].expert =
          static_cast<int16_t>(experts[0]);
    }
  }
  if (observer != nullptr) {
    observer->on_layer_routed(layer, batch, layout, &pages_, q_.data(), top_experts.data(),
                              top_gates.data(), s.top_k);
  }
  std::vector<MlpRows> routed;
  std::vector<int> routed_expert;
  for (int e = 0; e < E; ++e) {
    if (rows[e].empty()) continue;
    routed.push_back({&L.experts[e], &rows[e], {}});
    routed_expert.push_back(e);
  }
  run_mlps(routed, x, hidden);
  for (size_t j = 0; j < routed.size(); ++j) {
    const int e = routed_expert[j];
    if (observer != nullptr && observer->reads_expert_outputs())
      observer->on_expert_output(layer, e, rows[e], gates[e], routed[j].y.data(), hidden);
    if (disabled_ != std::pair<int, int>{layer, e})
      accumulate_rows(routed[j].y, hidden, rows[e], gates[e], out);
  }
  if (s.shared_intermediate > 0) {
    std::vector<float> shared_w(n, 1.0f);
    if (s.shared_expert_gated) {
      linear(L.shared_gate, x, n, shared_w.data());
      for (float& g : shared_w) g = 1.0f / (1.0f + std::exp(-g));
    }
    std::vector<MlpRows> shared = {{&L.shared, &all, {}}};
    run_mlps(shared, x, hidden);
    accumulate_rows(shared[0].y, hidden, all, shared_w, out);
  }
}

std::vector<float> CpuBackend::run(const StepPlan& plan, KvLayout& layout,
                                   ForwardObserver* observer) {
  const ForwardBatch& batch = plan.batch;
  const ModelSpec& s = model_->spec();
  const int n = batch.size();
  const int hidden = s.hidden_size;
  std::vector<float> x(static_cast<size_t>(n) * hidden), normed(x.size()), delta(x.size());
  for (int t = 0; t < n; ++t)
    matrix_row(model_->embed(), batch.tokens[t], x.data() + static_cast<size_t>(t) * hidden);

  int moe_index = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = model_->layer(l);
    rms_norm(x.data(), normed.data(), n, hidden, L.attn_norm.data(), s.rms_eps);
    attention_block(l, plan, layout, normed.data(), delta.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    rms_norm(x.data(), normed.data(), n, hidden, L.mlp_norm.data(), s.rms_eps);
    moe_block(l, moe_index, plan, layout, normed.data(), delta.data(), observer);
    if (s.layer_is_moe[l]) ++moe_index;
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
  }
  const std::vector<int32_t>& rows = plan.logit_rows;
  std::vector<float> final_x(rows.size() * hidden);
  for (size_t i = 0; i < rows.size(); ++i) {
    rms_norm(x.data() + static_cast<size_t>(rows[i]) * hidden, final_x.data() + i * hidden, 1,
             hidden, model_->final_norm().data(), s.rms_eps);
  }
  std::vector<float> logits(rows.size() * static_cast<size_t>(s.vocab_size));
  linear(model_->lm_head(), final_x.data(), static_cast<int>(rows.size()), logits.data());
  return logits;
}

}  // namespace ekva::cpu

namespace ekva::cpu {

void CpuBackend::apply(const EvictionPlan& plan, KvLayout& layout) {
  apply_on_host(plan, layout, pages_);
}

}  // namespace ekva::cpu
