#pragma once
// The engine: the one prefill -> compress -> decode -> evict loop. It owns the KV layout, a
// backend that executes steps and evictions, and the KV policy that decides them. generate, eval,
// calibrate and demo all run through it.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_layout.h"
#include "kv/policy.h"
#include "model/model.h"

namespace ekva {

struct EngineOptions {
  int num_sequences = 1;
  KvFormat kv;                    // page size and the stored element type of K and V
  int64_t kv_capacity_pages = 0;  // 0: every sequence at the model's full context
  BackendFactory backend;         // empty: the CPU backend
  // What runs `backend`, named in errors ("cuda"; cli::use_device sets it); ignored without one.
  std::string device;
};

class Engine {
 public:
  // Without a policy the cache keeps everything.
  Engine(const Model& model, const EngineOptions& options = {},
         std::optional<PolicyOptions> policy = std::nullopt);
  // Deep: the copy has its own layout, pages and policy state (one prefill, several policies).
  Engine(const Engine& other);
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return *model_; }
  const KvLayout& layout() const { return layout_; }
  Backend& backend() { return *backend_; }
  // Each sequence has its own policy (a server runs requests of different policies and budgets
  // side by side); null where the cache keeps everything.
  const KvPolicy* policy(int seq = 0) const;
  void set_policy(const PolicyOptions& options);  // every sequence's
  void set_policy(int seq, const PolicyOptions& options);
  // What set_policy refuses, without setting it: KvPolicy's checks, and a policy that ranks the
  // cached keys (keydiff) on a backend that keeps them on a device (kUnsupported).
  void check_policy(const PolicyOptions& options) const;

  // One step over any batch of tokens: plan on the host, run on the backend.
  std::vector<float> step(const ForwardBatch& batch, ForwardObserver* observer = nullptr);
  // Prefills tokens of `seq` from its next position; the policy's observation queries vote, and the
  // prompt's token ids and routing are kept for the policy's compression.
  // Returns the last token's logits, or every token's when all_logits.
  std::vector<float> prefill(int seq, std::span<const int32_t> tokens, bool all_logits = false,
                             ForwardObserver* observer = nullptr);
  // Prefills the next chunk of a prompt of prompt_len tokens, from the sequence's next position.
  // The policy's observation queries are those of the whole prompt wherever the chunks are cut, so
  // a prompt prefilled in chunks is scored as one prefilled at once. The chunk's last logits.
  std::vector<float> prefill_chunk(int seq, std::span<const int32_t> tokens, int prompt_len);
  // Compresses `seq` after its prompt of prompt_len tokens; fixes the budgets decode then holds.
  void compress(int seq, int prompt_len);
  // One token of `seq` at its next position, then eviction back to the budgets. Its logits.
  std::vector<float> decode(int seq, int32_t token);
  // One token for each of `seqs` (distinct) in one step, then each sequence evicted back to its
  // budget by its own policy. Logits [seqs.size(), vocab].
  std::vector<float> decode(std::span<const int> seqs, std::span<const int32_t> tokens);
  // The same, each sequence's next token drawn (draw_token) where the backend keeps the logits.
  std::vector<int32_t> decode_tokens(std::span<const int> seqs, std::span<const int32_t> tokens,
                                     std::span<const TokenDraw> draws);
  // Wall time of the last decode step's two phases, so that a server can say where its steps go:
  // the forward pass (plan and run, up to the logits on the host) and the policies' evictions
  // (selection on the host, compaction on the backend).
  struct DecodeTimes {
    double forward_s = 0.0;
    double evict_s = 0.0;
  };
  const DecodeTimes& last_decode_times() const { return last_decode_; }
  void clear(int seq);
  // Pages `seq` can hold at most over its next decode_steps decode steps, after compress(): each
  // (layer, KV head) table grows by one slot a step, and an evicting policy brings it back to its
  // budget after each.
  int64_t pages_bound(int seq, int decode_steps) const;

 private:
  const Model* model_;
  std::string device_;
  KvLayout layout_;
  std::unique_ptr<Backend> backend_;
  std::vector<float> prefill_batch(int seq, std::span<const int32_t> tokens, bool all_logits,
                                   ForwardObserver* observer, std::vector<uint8_t> score_query);
  void check_sequence(const char* what, int seq) const;
  // decode() and decode_tokens(): the step, run by `forward` on the batch, then the evictions.
  void decode_step(std::span<const int> seqs, std::span<const int32_t> tokens,
                   const std::function<void(const ForwardBatch&)>& forward);
  // Fails naming the first entry of `row` of the step that is not finite.
  [[noreturn]] void fail_not_finite(const StepPlan& plan, size_t row, int64_t entry) const;
  void check_backend(const KvPolicy& policy) const;
  // Refreshes the scores of a policy that ranks keys, before it selects.
  void score_keys(int seq);

  std::vector<std::optional<KvPolicy>> policies_;  // per sequence
  std::vector<PromptRouting> prompts_;             // per sequence
  DecodeTimes last_decode_;
};

}  // namespace ekva
