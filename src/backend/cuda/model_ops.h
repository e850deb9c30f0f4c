#pragma once
// The model's operators on the device, as the CUDA backend calls them: float32 activations, bf16
// GEMM inputs and weights, each operator the device twin of its CPU reference in src/backend/cpu
// (same order of operations, so that the backends differ by rounding alone). Stream-ordered; every
// launch is checked. Internal to src/backend/cuda.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/paged_kv.h"
#include "backend/token_draw.h"

namespace ekva::cuda {

// x[t] = embedding row tokens[t] (bf16 table [vocab, hidden]) as float32.
void embed_rows(const uint16_t* table, const int32_t* tokens, int n, int hidden, float* x,
                cudaStream_t stream);

// As cpu::rms_norm over `rows` rows of `dim`: out = x / rms(x) * weight. Either output may be null;
// out_f32 may be x itself.
void rms_norm(const float* x, int rows, int dim, const float* weight, float eps, float* out_f32,
              uint16_t* out_bf16, cudaStream_t stream);

// rms_norm in place of rows x dim and of rows2 x dim2 stored right after them (a step's queries
// and keys: QK-norm) in one launch.
void rms_norm_pair(float* x, int rows, int dim, const float* weight, int rows2, int dim2,
                   const float* weight2, float eps, cudaStream_t stream);
// inverse_rms[r] = 1 / rms of row r of the same two arrays (rows, then rows2), as rms_norm forms
// it: a whole projection's QK-norm, applied where the append reads its rows (KvAppend).
void inverse_rms_pair(const float* x, int rows, int dim, int rows2, int dim2, float eps,
                      float* inverse_rms, cudaStream_t stream);
// x += delta, then rms_norm of the sum (out_f32 is not x): a residual add and the norm after it.
void add_rms_norm(float* x, const float* delta, int rows, int dim, const float* weight, float eps,
                  float* out_f32, uint16_t* out_bf16, cudaStream_t stream);

// y[r, c] += bias[c] over rows x cols.
void add_bias(float* y, const float* bias, int rows, int cols, cudaStream_t stream);
// x[i] = clamp(x[i], -limit, limit).
void clamp_in_place(float* x, int64_t count, float limit, cudaStream_t stream);
// out[i] = bf16(x[i]).
void to_bf16(const float* x, int64_t count, uint16_t* out, cudaStream_t stream);

// Router::route per token: softmax over num_experts logits, the top_k best (ties to the lower id),
// gates renormalised over the top_k when asked. experts and gates: [n, top_k], best first.
void route_tokens(const float* logits, int n, int num_experts, int top_k, bool renormalise,
                  int32_t* experts, float* gates, cudaStream_t stream);
// The router's float32 logits (x [n, hidden] times router [num_experts, hidden] transposed, into
// logits) and route_tokens in one kernel, for the few tokens of a decode step, where a GEMV
// through cuBLAS and the routing took two or three kernels. Each logit's dot product is cut into
// up to 16 slices of the hidden size, whose sums are added in slice order. workspace:
// [kRouterWorkspaceWords], zero before the first call; calls leave it fit for the next. Given
// one_token_pairs (n = 1), it also writes the token's pairs as sort_pairs would.
inline constexpr int kMaxRoutedTokens = 64;
inline constexpr int kRouterPartials = 256;  // experts x slices per token, at most
inline constexpr size_t kRouterWorkspaceWords = size_t{kMaxRoutedTokens} * (1 + kRouterPartials);
struct MoePairs;
bool route_experts_supported(int n, int hidden, int num_experts);
void route_experts(const float* x, const float* router, int n, int hidden, int num_experts,
                   int top_k, bool renormalise, float* logits, int32_t* experts, float* gates,
                   uint32_t* workspace, const MoePairs* one_token_pairs, cudaStream_t stream);

// cpu::attention for one layer: each token's query heads over the retained slots of its
// (sequence, KV head) whose position is at most the token's, softmax scale 1/sqrt(head_dim).
// q: [n, num_q_heads, head_dim] float32; out: the same shape in bf16 (the O projection's input).
// When score_delta is set, the probabilities of the tokens score_query flags, summed over each KV
// head's query heads, are added to the pool-parallel score_delta.
struct PagedAttention {
  const float* q = nullptr;
  const int32_t* tokens = nullptr;     // when set, only these n of the step's tokens are attended
  const int32_t* sequences = nullptr;  // [n]
  const int32_t* positions = nullptr;  // [n]
  const uint8_t* score_query = nullptr;
  float* score_delta = nullptr;
  uint16_t* out = nullptr;
  int n = 0;
  int num_q_heads = 0;
};
void paged_attention(const PagedKvLayer& kv, const PagedAttention& attention, cudaStream_t stream);

// paged_attention's outputs (not its scores) on the tensor cores, for steps with runs of a
// sequence's tokens: tiles[2i] is the first token of tile i and tiles[2i + 1] its count, at most
// kPrefillTileTokens tokens of one sequence. head_dim 32, 64 or 128 (prefill_attention_supported).
inline constexpr int kPrefillTileTokens = 128;
struct PrefillAttention {
  const uint16_t* q = nullptr;  // bf16 [n, num_q_heads, head_dim], rotated
  const int32_t* sequences = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* tiles = nullptr;
  int num_tiles = 0;
  uint16_t* out = nullptr;
  int num_q_heads = 0;
};
bool prefill_attention_supported(int head_dim);
// The tiles of a step's n tokens (host side): each run of consecutive tokens of one sequence, cut
// into pieces of at most kPrefillTileTokens.
std::vector<int32_t> prefill_tiles(const int32_t* sequences, int n);
void prefill_attention(const PagedKvLayer& kv, const PrefillAttention& attention,
                       cudaStream_t stream);

// out[i] = bf16(rows[i] of x), x bf16 [?, cols].
void gather_rows(const uint16_t* x, const int32_t* rows, int count, int cols, uint16_t* out,
                 cudaStream_t stream);
// out[r, c] = bf16(silu(gate_up[r, c]) * gate_up[r, inter + c]) over rows x inter: the SwiGLU of
// a fused [gate; up] product.
void silu_mul(const float* gate_up, int rows, int inter, uint16_t* out, cudaStream_t stream);
// out[rows[i]] += weights[i] * y[i] (rows distinct), y [count, cols]; rows null: row i itself;
// weights null: 1.
void scatter_add_rows(const float* y, const int32_t* rows, const float* weights, int count,
                      int cols, float* out, cudaStream_t stream);
// Seeded random weights: uniform with the given standard deviation, a function of (seed, index).
void fill_random_bf16(uint16_t* x, int64_t count, uint64_t seed, float stddev, cudaStream_t stream);
void fill_random_f32(float* x, int64_t count, uint64_t seed, float stddev, cudaStream_t stream);
void fill_constant(float* x, int64_t count, float value, cudaStream_t stream);

// Routed experts on the device alone (no host synchronisation), at most kMaxGroupedExperts
// experts: each expert's pairs in groups of at most moe_group_tokens, one grouped product each.
inline constexpr int kMaxGroupedTokens = 64;
inline constexpr int kWideGroupTokens = 128;
inline constexpr int kMaxGroupedExperts = 256;
// The pairs per group of a step of n tokens: kWideGroupTokens where the step is larger than a
// group of kMaxGroupedTokens and its experts get that many pairs on average (prompts, large
// decode batches), so that a weight byte read serves twice the tokens; kMaxGroupedTokens else.
inline int moe_group_tokens(int n, int top_k, int num_experts) {
  const bool wide =
      n > kMaxGroupedTokens &&
      static_cast<int64_t>(n) * top_k >= static_cast<int64_t>(kMaxGroupedTokens) * num_experts;
  return wide ? kWideGroupTokens : kMaxGroupedTokens;
}

// The step's (token, expert) pairs in ascending expert order (tokens ascending within an expert);
// device arrays of n * top_k entries unless said otherwise.
struct MoePairs {
  int32_t* token = nullptr;
  float* gate = nullptr;
  int32_t* expert = nullptr;
  int32_t* token_pairs = nullptr;  // token t's pairs at [t * top_k, ...), ascending expert
  // The groups: an expert's pairs in groups of at most moe_group_tokens (consecutive groups of
  // an expert run side by side and so share its weights in L2), experts ascending.
  int32_t* group_expert = nullptr;  // [pairs]: each group's expert
  int32_t* group_first = nullptr;   // [groups + 1]: each group's first pair, then the total
  int32_t* num_groups = nullptr;    // [1]
};
// The int32s of the index arrays of `pairs` pairs (groups never outnumber pairs).
inline size_t moe_pair_ints(size_t pairs) {
  return 5 * pairs + 2;
}
// The views of MoePairs over ints [moe_pair_ints(pairs)] and gates [pairs].
inline MoePairs moe_pairs(int32_t* ints, float* gates, size_t pairs) {
  MoePairs p;
  p.token = ints;
  p.expert = ints + pairs;
  p.token_pairs = ints + 2 * pairs;
  p.group_expert = ints + 3 * pairs;
  p.group_first = ints + 4 * pairs;
  p.num_groups = ints + 5 * pairs + 1;
  p.gate = gates;
  return p;
}
void sort_pairs(const int32_t* experts, const float* gates, int n, int top_k, int num_experts,
                const MoePairs& pairs, cudaStream_t stream);

// out[j] = W_{expert of pair j} · input row (the pair's token when input_is_token, else j), for
// every pair j: each touched expert's weights are read once for each group of its pairs.
struct GroupedGemm {
  const uint16_t* const* weights = nullptr;  // [experts]: bf16 [out_rows, in_cols] each
  // Instead of experts and pairs: one matrix times input rows 0 .. dense_rows (skinny_gemm).
  const uint16_t* dense = nullptr;
  int dense_rows = 0;
  const uint16_t* input = nullptr;  // bf16 rows of in_cols
  bool input_is_token = false;
  float* out = nullptr;  // [pairs, out_rows]
  int out_rows = 0;
  // Dense only: when set, out holds the output rows in consecutive arrays, [dense_rows,
  // first_block_rows] and then [dense_rows, block_rows] for each further block of block_rows.
  int first_block_rows = 0;
  int block_rows = 0;
  int in_cols = 0;
  // When set (one input row per group, or groups of kWideGroupTokens: moe_group_tokens), out is
  // not written: swiglu_out [pairs, out_rows / 2]
  // gets bf16(silu(gate) * up) of the two halves of the output rows, as silu_mul forms it.
  uint16_t* swiglu_out = nullptr;
  // When set (groups of kWideGroupTokens), out is not written: out_bf16 [pairs, out_rows] gets the
  // output rows rounded to bf16, as the model's own bf16 expert outputs are: a prompt's down
  // product, whose rows combine_pairs reads back, moves half the bytes each way.
  uint16_t* out_bf16 = nullptr;
};
bool grouped_gemm_supported(int in_cols, int num_experts);
// y[n, out_rows] = x[n, in_cols] · Wᵀ (bf16 inputs, float32 y) for at most kMaxGroupedTokens rows
// on the grouped product's kernel: Gemm::bf16's path for decode-sized products, which cuBLAS runs
// well below the bandwidth a GEMV-like product needs.
bool skinny_gemm_supported(int n, int in_cols);
void skinny_gemm(const uint16_t* x, int n, const uint16_t* w, int out_rows, int in_cols, float* y,
                 cudaStream_t stream);
// The same over a matrix of stacked blocks (a fused [Q; K; V]): y holds [n, first_rows], then
// [n, block_rows] for each further block of block_rows weight rows.
void skinny_gemm_blocks(const uint16_t* x, int n, const uint16_t* w, int first_rows, int block_rows,
                        int out_rows, int in_cols, float* y, cudaStream_t stream);
void grouped_gemm(const GroupedGemm& gemm, const MoePairs& pairs, int n, int top_k, int num_experts,
                  cudaStream_t stream);
// A one-token step's products and combine_pairs in one kernel: out[0] = the sum of gate * W_e ·
// input row over the token's pairs in ascending expert order, skipping disabled_expert; g.out is
// not used. Top-k of 1, 2, 4 or 8.
bool combined_gemv_supported(int n, int top_k);
void grouped_gemm_combined(const GroupedGemm& gemm, const MoePairs& pairs, int top_k,
                           int disabled_expert, float* out, cudaStream_t stream);
// out[t] = the sum of gate * y[pair] over token t's pairs in ascending expert order, skipping
// disabled_expert (-1: none). Top-k of 1 to 32, as route_tokens takes.
void combine_pairs(const float* y, const MoePairs& pairs, int n, int top_k, int hidden,
                   int disabled_expert, float* out, cudaStream_t stream);
// The same over bf16 rows (wide groups' down product). With norm.weight, out is the residual
// instead: out[t] += that sum, then rms_norm of out[t] with norm.weight and norm.eps into
// norm.out_bf16 (add_rms_norm's output): a prompt's expert sum, residual add and next norm in one
// kernel, a CTA a token.
struct ResidualNorm {
  const float* weight = nullptr;
  float eps = 0.0f;
  uint16_t* out_bf16 = nullptr;
};
void combine_pairs(const uint16_t* y, const MoePairs& pairs, int n, int top_k, int hidden,
                   int disabled_expert, float* out, const ResidualNorm& norm, cudaStream_t stream);

// Workspace bytes of greedy_tokens for rows of vocab logits.
size_t greedy_tokens_workspace(int rows, int vocab);
// out[r] = the lowest id among the largest entries of logits row r ([rows, vocab]), or -1 - e when
// entry e is the row's first that is not finite (Backend::run_greedy). The workspace is zero before
// its first call, and each call leaves it so (its per-row counters) for the next.
void greedy_tokens(const float* logits, int rows, int vocab, void* workspace,
                   size_t workspace_bytes, int32_t* out, cudaStream_t stream);

// Workspace bytes of sample_tokens for rows of vocab logits.
size_t sample_tokens_workspace(int rows, int vocab);
// tokens[r] = draw_token(logits row r, draws[r]) for each row whose draw has a temperature above 0
// and whose greedy token (tokens[r], from greedy_tokens) is not an error; the other rows keep
// theirs. draws: a device array of rows.
void sample_tokens(const float* logits, int rows, int vocab, const TokenDraw* draws,
                   void* workspace, size_t workspace_bytes, int32_t* tokens, cudaStream_t stream);

// x[i] = 1 / (1 + exp(-x[i])).
void sigmoid_in_place(float* x, int count, cudaStream_t stream);

}  // namespace ekva::cuda
