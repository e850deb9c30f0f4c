#pragma once
// The engine: the one prefill -> compress -> decode -> evict loop. It owns the KV layout, a
// backend that executes steps and evictions, and the KV policy that decides them. generate, eval,
// calibrate and demo all run through it.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
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
  const KvPolicy* policy() const { return policy_ ? &*policy_ : nullptr; }
  void set_policy(const PolicyOptions& options);

  // One step over any batch of tokens: plan on the host, run on the backend.
  std::vector<float> step(const ForwardBatch& batch, ForwardObserver* observer = nullptr);
  // Prefills tokens of `seq` from its next position; the policy's observation queries vote, and the
  // prompt's token ids and routing are kept for the policy's compression.
  // Returns the last token's logits, or every token's when all_logits.
  std::vector<float> prefill(int seq, std::span<const int32_t> tokens, bool all_logits = false,
                             ForwardObserver* observer = nullptr);
  // Compresses `seq` after its prompt of prompt_len tokens; fixes the budgets decode then holds.
  void compress(int seq, int prompt_len);
  // One token of `seq` at its next position, then eviction back to the budgets. Its logits.
  std::vector<float> decode(int seq, int32_t token);
  void clear(int seq);

 private:
  const Model* model_;
  KvLayout layout_;
  std::unique_ptr<Backend> backend_;
  std::optional<KvPolicy> policy_;
  std::vector<PromptRouting> prompts_;  // per sequence
};

}  // namespace ekva
