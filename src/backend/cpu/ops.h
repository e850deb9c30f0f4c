#pragma once
// CPU reference operators. float32 activations; weights in their stored dtype, converted on the
// fly.
#include <cstdint>
#include <span>
#include <vector>

#include "arch/rope_table.h"
#include "core/weight_matrix.h"
#include "kv/kv_layout.h"
#include "kv/kv_pages.h"

namespace ekva::cpu {

// Up to this many rows of x, linear streams each weight row once (a GEMV); above, BLAS sgemm on
// float32 weights.
inline constexpr int kStreamedRows = 4;

// y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias).
void linear(const WeightMatrix& w, const float* x, int n, float* y, const float* bias = nullptr);

// One of several products: y[n, w->rows] = x[n, w->cols] · wᵀ (+ bias).
struct Product {
  const WeightMatrix* w = nullptr;
  const float* x = nullptr;
  int n = 0;
  float* y = nullptr;
  const float* bias = nullptr;
};
// All of the products: those of up to kStreamedRows rows in one parallel pass over all their
// weight rows, so that threads meet at one barrier instead of one per product (a decode step has
// dozens of them); the others one sgemm each.
void linear(std::span<const Product> products);

// Row r of w converted to float32 (embedding lookup).
void matrix_row(const WeightMatrix& w, int r, float* out);

// In place over n rows of width dim; weight has dim entries.
void rms_norm(float* x, int n, int dim, const float* weight, double eps);
// out = rms_norm(x) without touching x.
void rms_norm(const float* x, float* out, int n, int dim, const float* weight, double eps);

// Rotary embedding (rotate-half layout, as Hugging Face's Llama family) with scaling from `rope`.
class Rope {
 public:
  Rope(const RopeSpec& rope, int head_dim);
  // x: n rows of num_heads·head_dim; positions: n entries.
  void apply(float* x, int n, int num_heads, const int32_t* positions) const;

 private:
  int head_dim_;
  RopeTable table_;
};

// out[i] = silu(gate[i]) * up[i].
void silu_mul(const float* gate, const float* up, float* out, size_t n);

// Softmax weights of one query head (q: head_dim floats) over the retained slots of a (sequence,
// layer, KV head): weights[i] for slot i, 0 for slots whose position is after query_pos. All zero
// when no slot is visible.
void attention_weights(const KvPages& pages, const HeadTable& table, const float* q, int query_pos,
                       float* weights);

// Softmax attention of each token's query heads over the retained K/V of its (sequence, layer,
// KV head) with position <= the token's own. q and out: n rows of spec.q_dim(). When score_query is
// given, the attention probabilities of the tokens it flags, summed over a KV head's query heads,
// are added to each retained slot's TokenMeta::score (what H2O, SnapKV and EKVA rank by).
void attention(KvLayout& layout, const KvPages& pages, int layer, const float* q,
               const int32_t* seq, const int32_t* pos, int n, int num_heads, float* out,
               const uint8_t* score_query = nullptr);

}  // namespace ekva::cpu
