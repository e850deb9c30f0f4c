#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {

void validate_batch(const ModelSpec& spec, const KvCache& cache, const ForwardBatch& batch) {
  if (batch.seq.size() != batch.tokens.size() || batch.pos.size() != batch.tokens.size() ||
      (!batch.score_query.empty() && batch.score_query.size() != batch.tokens.size())) {
    fail(ErrorKind::kInvalidArgument,
         "forward batch: tokens, seq, pos and score_query differ in length");
  }
  for (int i = 0; i < batch.size(); ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= spec.vocab_size) {
      fail(ErrorKind::kInvalidArgument, "token id {} at index {} is outside the vocabulary [0, {})",
           batch.tokens[i], i, spec.vocab_size);
    }
    if (batch.seq[i] < 0 || batch.seq[i] >= cache.num_sequences()) {
      fail(ErrorKind::kInvalidArgument,
           "sequence {} at index {} is outside the cache's {} sequences", batch.seq[i], i,
           cache.num_sequences());
    }
    if (batch.pos[i] < 0 || batch.pos[i] >= spec.max_position) {
      fail(ErrorKind::kInvalidArgument,
           "position {} exceeds the model's context of {} tokens (max_position_embeddings)",
           batch.pos[i], spec.max_position);
    }
  }
  for (int32_t r : batch.logit_rows) {
    if (r < 0 || r >= batch.size())
      fail(ErrorKind::kInvalidArgument, "logit row {} out of range", r);
  }
}

Forward::Forward(const Model& model, KvCache& cache)
    : model_(model), cache_(cache), rope_(model.spec().rope, model.spec().head_dim) {}

void Forward::attention_block(int layer, const ForwardBatch& batch, const float* x, float* out) {
  const ModelSpec& s = model_.spec();
  const LayerWeights& L = model_.layer(layer);
  const int n = batch.size();
  const int d = s.head_dim;
  std::vector<float>& q = q_;
  q.resize(static_cast<size_t>(n) * s.q_dim());
  std::vector<float> k(static_cast<size_t>(n) * s.kv_dim()), v(static_cast<size_t>(n) * s.kv_dim());
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  const cpu::Product qkv[] = {{&L.q, x, n, q.data(), bias(L.q_bias)},
                              {&L.k, x, n, k.data(), bias(L.k_bias)},
                              {&L.v, x, n, v.data(), bias(L.v_bias)}};
  cpu::linear(qkv);
  if (s.qk_norm == QkNorm::kPerHead) {
    cpu::rms_norm(q.data(), n * s.num_heads, d, L.q_norm.data(), s.rms_eps);
    cpu::rms_norm(k.data(), n * s.num_kv_heads, d, L.k_norm.data(), s.rms_eps);
  } else if (s.qk_norm == QkNorm::kWholeProjection) {
    cpu::rms_norm(q.data(), n, s.q_dim(), L.q_norm.data(), s.rms_eps);
    cpu::rms_norm(k.data(), n, s.kv_dim(), L.k_norm.data(), s.rms_eps);
  }
  if (s.clip_qkv) {
    const float c = *s.clip_qkv;
    for (auto* buf : {&q, &k, &v}) {
      for (float& e : *buf) e = std::clamp(e, -c, c);
    }
  }
  rope_.apply(q.data(), n, s.num_heads, batch.pos.data());
  rope_.apply(k.data(), n, s.num_kv_heads, batch.pos.data());
  slots_.resize(static_cast<size_t>(n) * s.num_kv_heads);
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const size_t off = static_cast<size_t>(t) * s.kv_dim() + static_cast<size_t>(h) * d;
      TokenMeta meta;
      meta.position = batch.pos[t];
      slots_[static_cast<size_t>(t) * s.num_kv_heads + h] =
          cache_.append(batch.seq[t], layer, h, k.data() + off, v.data() + off, meta);
    }
  }
  std::vector<float> attn(static_cast<size_t>(n) * s.q_dim());
  cpu::attention(cache_, layer, q.data(), batch.seq.data(), batch.pos.data(), n, s.num_heads,
                 attn.data(), batch.score_query.empty() ? nullptr : batch.score_query.data());
  cpu::linear(L.o, attn.data(), n, out, bias(L.o_bias));
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
    std::vector<cpu::Product> products;
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
    cpu::linear(products);
    products.clear();
    for (size_t j = 0; j < count; ++j) {
      const int n = static_cast<int>(batch[j]->rows->size());
      cpu::silu_mul(g[j].data(), u[j].data(), g[j].data(), g[j].size());
      batch[j]->y.resize(static_cast<size_t>(n) * hidden);
      products.push_back({&batch[j]->mlp->down, g[j].data(), n, batch[j]->y.data()});
    }
    cpu::linear(products);
  };
  std::vector<MlpRows*> few;
  for (MlpRows& job : jobs) {
    if (job.rows->size() <= static_cast<size_t>(cpu::kStreamedRows)) {
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

void Forward::moe_block(int layer, int moe_index, const ForwardBatch& batch, const float* x,
                        float* out, ForwardObserver* observer) {
  const ModelSpec& s = model_.spec();
  const int n = batch.size();
  const LayerWeights& L = model_.layer(layer);
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
  cpu::linear(L.router, x, n, logits.data());
  if (observer != nullptr) observer->on_router_logits(layer, moe_index, logits.data(), n, E);

  std::vector<std::vector<int32_t>> rows(E);
  std::vector<std::vector<float>> gates(E);
  std::vector<float> prob(E);
  std::vector<int> order(E);
  std::vector<int32_t> top_experts(static_cast<size_t>(n) * s.top_k);
  std::vector<float> top_gates(top_experts.size());
  for (int t = 0; t < n; ++t) {
    const float* lr = logits.data() + static_cast<size_t>(t) * E;
    const float mx = *std::max_element(lr, lr + E);
    float sum = 0.0f;
    for (int e = 0; e < E; ++e) sum += prob[e] = std::exp(lr[e] - mx);
    for (int e = 0; e < E; ++e) prob[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(), [&](int a, int b) {
      return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
    });
    float top_sum = 0.0f;
    for (int i = 0; i < s.top_k; ++i) top_sum += prob[order[i]];
    for (int i = 0; i < s.top_k; ++i) {
      const int e = order[i];
      rows[e].push_back(t);
      gates[e].push_back(s.norm_topk_prob ? prob[e] / top_sum : prob[e]);
      top_experts[static_cast<size_t>(t) * s.top_k + i] = e;
      top_gates[static_cast<size_t>(t) * s.top_k + i] = gates[e].back();
    }
    // The token's KV entries at this layer learn its routing now that the router has run.
    for (int h = 0; h < s.num_kv_heads; ++h) {
      TokenMeta& meta = cache_.table(batch.seq[t], layer, h)
                            .meta[slots_[static_cast<size_t>(t) * s.num_kv_heads + h]];
      meta.expert = static_cast<int16_t>(order[0]);
      meta.second = s.top_k > 1 ? static_cast<int16_t>(order[1]) : int16_t{-1};
      meta.gate = gates[order[0]].back();
    }
  }
  if (observer != nullptr) {
    observer->on_layer_routed(layer, batch, cache_, q_.data(), top_experts.data(), top_gates.data(),
                              s.top_k);
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
    if (observer != nullptr)
      observer->on_expert_output(layer, e, rows[e], gates[e], routed[j].y.data(), hidden);
    if (disabled_ != std::pair<int, int>{layer, e})
      accumulate_rows(routed[j].y, hidden, rows[e], gates[e], out);
  }
  if (s.shared_intermediate > 0) {
    std::vector<float> shared_w(n, 1.0f);
    if (s.shared_expert_gated) {
      cpu::linear(L.shared_gate, x, n, shared_w.data());
      for (float& g : shared_w) g = 1.0f / (1.0f + std::exp(-g));
    }
    std::vector<MlpRows> shared = {{&L.shared, &all, {}}};
    run_mlps(shared, x, hidden);
    accumulate_rows(shared[0].y, hidden, all, shared_w, out);
  }
}

std::vector<float> Forward::run(const ForwardBatch& batch, ForwardObserver* observer) {
  const ModelSpec& s = model_.spec();
  validate_batch(s, cache_, batch);
  const int n = batch.size();
  const int hidden = s.hidden_size;
  std::vector<float> x(static_cast<size_t>(n) * hidden), normed(x.size()), delta(x.size());
  for (int t = 0; t < n; ++t)
    cpu::matrix_row(model_.embed(), batch.tokens[t], x.data() + static_cast<size_t>(t) * hidden);

  int moe_index = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = model_.layer(l);
    cpu::rms_norm(x.data(), normed.data(), n, hidden, L.attn_norm.data(), s.rms_eps);
    attention_block(l, batch, normed.data(), delta.data());
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    cpu::rms_norm(x.data(), normed.data(), n, hidden, L.mlp_norm.data(), s.rms_eps);
    moe_block(l, moe_index, batch, normed.data(), delta.data(), observer);
    if (s.layer_is_moe[l]) ++moe_index;
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
  }
  // Each sequence's next position follows the highest position it received in this batch.
  for (int t = 0; t < n; ++t) {
    const int32_t next = batch.pos[t] + 1;
    if (next > cache_.next_position(batch.seq[t]))
      cache_.advance(batch.seq[t], next - cache_.next_position(batch.seq[t]));
  }

  std::vector<int32_t> rows = batch.logit_rows;
  if (rows.empty()) {
    rows.resize(n);
    std::iota(rows.begin(), rows.end(), 0);
  }
  std::vector<float> final_x(rows.size() * hidden);
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::rms_norm(x.data() + static_cast<size_t>(rows[i]) * hidden, final_x.data() + i * hidden, 1,
                  hidden, model_.final_norm().data(), s.rms_eps);
  }
  std::vector<float> logits(rows.size() * static_cast<size_t>(s.vocab_size));
  cpu::linear(model_.lm_head(), final_x.data(), static_cast<int>(rows.size()), logits.data());
  return logits;
}

}  // namespace ekva
