#pragma once
// One forward step over a ragged batch: any number of tokens from any sequences, each with its
// position. Prefill (many tokens of a sequence), decode (one token per sequence) and their mix are
// the same call; each token attends to its sequence's retained KV up to its own position.
#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"
#include "model/model.h"

namespace ekva {

struct ForwardBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> seq;
  std::vector<int32_t> pos;
  // Tokens whose logits are wanted, as indices into `tokens`; empty: all.
  std::vector<int32_t> logit_rows;
  // Per token: 1 when its attention should add to the retained slots' scores; empty: none.
  std::vector<uint8_t> score_query;

  void add(int32_t token, int32_t sequence, int32_t position) {
    tokens.push_back(token);
    seq.push_back(sequence);
    pos.push_back(position);
  }
  int size() const { return static_cast<int>(tokens.size()); }
};

// Hooks that see a forward as it runs (calibration statistics, policies). Default: ignore.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // Router logits of one MoE layer: n_tokens rows of num_experts. moe_index counts MoE layers only.
  virtual void on_router_logits(int /*layer*/, int /*moe_index*/, const float* /*logits*/,
                                int /*n_tokens*/, int /*num_experts*/) {}
  // One routed expert's output for the tokens routed to it (before the gate): rows.size() x hidden.
  virtual void on_expert_output(int /*layer*/, int /*expert*/, const std::vector<int32_t>& /*rows*/,
                                const std::vector<float>& /*gates*/, const float* /*output*/,
                                int /*hidden*/) {}
  // An MoE layer after routing: the cache holds this batch's K/V with their routing metadata; q is
  // the batch's post-RoPE queries [n, q_dim]; experts and gates are [n, top_k], best first.
  virtual void on_layer_routed(int /*layer*/, const ForwardBatch& /*batch*/,
                               const KvCache& /*cache*/, const float* /*q*/,
                               const int32_t* /*experts*/, const float* /*gates*/, int /*top_k*/) {}
};

// Keeps every MoE layer's router logits, in the layout of Hugging Face's output_router_logits:
// logits[moe_index] is [tokens of the batch, num_experts].
class RouterLogitsRecorder : public ForwardObserver {
 public:
  void on_router_logits(int, int moe_index, const float* l, int n, int e) override {
    if (static_cast<int>(logits.size()) <= moe_index) logits.resize(moe_index + 1);
    logits[moe_index].insert(logits[moe_index].end(), l, l + static_cast<size_t>(n) * e);
  }
  std::vector<std::vector<float>> logits;
};

class Forward {
 public:
  Forward(const Model& model, KvCache& cache);
  // Appends the batch's K/V to the cache, advances each sequence's position, and returns
  // logits [rows, vocab] for batch.logit_rows (all tokens when empty).
  std::vector<float> run(const ForwardBatch& batch, ForwardObserver* observer = nullptr);
  // Drops one routed expert's output at one layer (calibration's loss-contribution ablation);
  // layer -1 restores the model.
  void disable_expert(int layer, int expert) { disabled_ = {layer, expert}; }

 private:
  void attention_block(int layer, const ForwardBatch& batch, const float* x, float* out);
  void moe_block(int layer, int moe_index, const ForwardBatch& batch, const float* x, float* out,
                 ForwardObserver* observer);

  const Model& model_;
  KvCache& cache_;
  cpu::Rope rope_;
  // The slot each token's K/V took in each KV head at the current layer: [token][kv head].
  std::vector<int32_t> slots_;
  std::vector<float> q_;  // the current layer's post-RoPE queries, for observers
  std::pair<int, int> disabled_{-1, -1};
};

// Checks token ids against the vocabulary and positions against the context; throws
// kInvalidArgument.
void validate_batch(const ModelSpec& spec, const KvCache& cache, const ForwardBatch& batch);

}  // namespace ekva
