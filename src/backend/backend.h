#pragma once
// The seam between the engine and the hardware. A step is planned on the host (plan_step: which
// slot every token's K/V takes at every layer, what each layer's attention reads, how large the
// expert row lists can get; testable without a device), then a backend runs it into its own
// workspaces; evictions decided by a policy (EvictionPlan) are executed by the backend too. The CPU
// backend is the reference for every other. To add a backend: implement Backend over the same
// KvLayout page ids with your own page storage, and check it against CpuBackend (tests/backend).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "arch/model_spec.h"
#include "backend/token_draw.h"
#include "kv/eviction_plan.h"
#include "kv/kv_layout.h"
#include "kv/kv_pages.h"

namespace ekva {

class Model;

// Any number of tokens from any sequences, each with its position: prefill (many tokens of a
// sequence), decode (one token per sequence) and their mix are the same step.
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

// Hooks that see a step as it runs on the host (calibration statistics). Default: ignore.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  // Router logits of one MoE layer: n_tokens rows of num_experts. moe_index counts MoE layers only.
  virtual void on_router_logits(int /*layer*/, int /*moe_index*/, const float* /*logits*/,
                                int /*n_tokens*/, int /*num_experts*/) {}
  // What the observer reads beyond routing, which a device backend copies to the host only when
  // asked: the pages and queries of on_layer_routed, and the expert outputs (on_expert_output is
  // called only when this says so).
  virtual bool reads_kv() const { return false; }
  virtual bool reads_expert_outputs() const { return false; }
  // One routed expert's output for the tokens routed to it (before the gate): rows.size() x hidden.
  virtual void on_expert_output(int /*layer*/, int /*expert*/, const std::vector<int32_t>& /*rows*/,
                                const std::vector<float>& /*gates*/, const float* /*output*/,
                                int /*hidden*/) {}
  // An MoE layer after routing: the layout and pages hold this batch's K/V with their routing
  // metadata; q is the batch's post-RoPE queries [n, q_dim] (pages and q may be null unless
  // reads_kv()); experts and gates are [n, top_k], best first.
  virtual void on_layer_routed(int /*layer*/, const ForwardBatch& /*batch*/,
                               const KvLayout& /*layout*/, const KvPages* /*pages*/,
                               const float* /*q*/, const int32_t* /*experts*/,
                               const float* /*gates*/, int /*top_k*/) {}
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

struct StepPlan {
  ForwardBatch batch;
  int num_layers = 0;
  int num_sequences = 0;
  int num_kv_heads = 0;
  // [layer][token][kv head]: the slot the token's K and V take in its segment.
  std::vector<int32_t> slots;
  // [layer][sequence][kv head]: the segment's length once the step's tokens are in; 0 for
  // sequences the step does not touch. What each layer's attention reads.
  std::vector<int32_t> lengths;
  // Rows the expert lists of one MoE layer can hold at most (tokens x top_k).
  int expert_rows = 0;
  // Logit rows, resolved: batch.logit_rows, or every token.
  std::vector<int32_t> logit_rows;

  int32_t slot(int layer, int token, int kv_head) const {
    return slots[(static_cast<size_t>(layer) * batch.size() + token) * num_kv_heads + kv_head];
  }
  int32_t length(int layer, int seq, int kv_head) const {
    return lengths[(static_cast<size_t>(layer) * num_sequences + seq) * num_kv_heads + kv_head];
  }
};

// Whether a step of `tokens` tokens runs its routed experts as grouped products over its (token,
// expert) pairs, each touched expert's weights read once per group of its pairs (steps of up to
// kMaxGroupedStepTokens tokens: decode; and steps whose experts average at most
// kMaxMeanGroupedPairs pairs: a fine-grained model's prompt), rather than as one GEMM per expert
// (a coarse model's prompt). The CUDA backend runs its experts so; the Roofline model costs them
// so.
inline constexpr int kMaxGroupedStepTokens = 64;
inline constexpr int64_t kMaxMeanGroupedPairs = 8 * kMaxGroupedStepTokens;
bool routed_experts_grouped(int64_t tokens, int top_k, int num_experts);

// Checks the batch (token ids against the vocabulary, sequences against the layout, positions
// against the context; throws kInvalidArgument), reserves a slot for every token at every
// (layer, KV head) in `layout`, and advances each sequence's next position past its tokens.
StepPlan plan_step(const ModelSpec& spec, const ForwardBatch& batch, KvLayout& layout);

class Backend {
 public:
  virtual ~Backend() = default;
  // A copy with its own page storage (one prefill shared by several policies).
  virtual std::unique_ptr<Backend> clone() const = 0;
  // Executes a planned step: stores K/V at the planned slots, fills the slots' routing metadata,
  // adds scores for the batch's scoring queries (to the layout's metadata, or to a copy of the
  // backend's own that sync_scores brings to the layout), and returns logits [rows, vocab] for the
  // plan's logit rows.
  virtual std::vector<float> run(const StepPlan& plan, KvLayout& layout,
                                 ForwardObserver* observer) = 0;
  // run(), then each logit row's token under its draw (draw_token: -1 - e for a row whose entry e
  // is its first that is not finite). A backend that can draw where the logits are brings only
  // the tokens to the host (a step of 64 sequences of a 152k vocabulary has 39 MB of logits).
  virtual std::vector<int32_t> run_tokens(const StepPlan& plan, KvLayout& layout,
                                          std::span<const TokenDraw> draws);
  // Brings the retention scores of `seq`'s retained slots into the layout's metadata, for
  // selections made on the host (compression, group quotas). A backend that keeps the scores with
  // its pages adds to them every step and copies them only when asked: copying a whole pool's
  // scores every decode step would cost what a budget saves.
  virtual void sync_scores(int /*seq*/, KvLayout& /*layout*/) {}
  // Executes an eviction: pools scores, selects exactly as select_evictions does, and compacts.
  virtual void apply(const EvictionPlan& plan, KvLayout& layout) = 0;
  // The evictions of several distinct sequences (a decode step's), with the result of applying
  // each in turn; a backend may execute them in one pass.
  virtual void apply_all(std::span<const EvictionPlan> plans, KvLayout& layout) {
    for (const EvictionPlan& plan : plans) apply(plan, layout);
  }
  // Drops one routed expert's output at one layer (calibration's loss-contribution ablation);
  // layer -1 restores the model.
  virtual void disable_expert(int layer, int expert) = 0;
  // The K/V pages when they live on the host, for policies that rank the cached keys; null when a
  // device keeps them (reading them back every decode step would cost what eviction saves).
  virtual const KvPages* host_pages() const { return nullptr; }
};

// Makes the backend that runs an engine's steps over its layout; the CLI picks one per --device.
using BackendFactory = std::function<std::unique_ptr<Backend>(const Model&, const KvLayout&)>;

}  // namespace ekva
