#pragma once
// KV compression policies: which retained tokens each (sequence, layer, KV head) keeps after
// prefill and which it evicts during decode. All share the KvCache machinery; they differ in the
// scores they rank by and in how the budget is split over layers, heads and expert groups.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv/budget_plan.h"
#include "kv/kv_cache.h"

namespace ekva {

struct PolicyOptions {
  std::string name = "full";
  // <= 1: a fraction of the prompt; > 1: tokens per (layer, KV head). Fixed when the prompt is
  // compressed.
  double budget = 1.0;
  int window = 16;         // most recent tokens always kept; SnapKV's observation window
  int sinks = 4;           // streaming: the first tokens, always kept
  int pool_kernel = 7;     // SnapKV: max-pool width over positions
  double ada_floor = 0.2;  // Ada-KV: each head keeps at least this share of the mean head budget
  int refresh = 64;        // ekva-online: decode steps between group-budget refreshes
  std::optional<BudgetPlan> plan;  // ekva and its ablations: budgets per (layer, head, group)
  uint64_t seed = 0;               // ekva-random-groups: the random expert labels
};

class KvPolicy {
 public:
  // Throws kInvalidArgument for an unknown name (listing the known ones) or a budget below one
  // token.
  KvPolicy(const PolicyOptions& options, const ModelSpec& spec);
  static const std::vector<std::string>& names();

  const PolicyOptions& options() const { return options_; }
  bool keeps_everything() const { return kind_ == Kind::kFull; }
  // Per prompt token: 1 when its attention should feed the retention scores during prefill.
  std::vector<uint8_t> prefill_score_queries(int prompt_len) const;
  // Whether decode queries add their attention to the scores.
  bool scores_decode() const;
  // Compresses a sequence right after its prompt of prompt_len tokens was prefilled, and fixes the
  // budgets that decode-time eviction then holds.
  void compress(KvCache& cache, int seq, int prompt_len);
  // After a decode step appended one token per (layer, KV head): evicts back down to the budgets.
  void evict(KvCache& cache, int seq);
  // Tokens (layer, KV head) of `seq` may hold; valid after compress().
  int head_budget(int seq, int layer, int kv_head) const;

 private:
  enum class Kind {
    kFull,
    kStreaming,
    kH2o,
    kSnapKv,
    kPyramidKv,
    kAdaKv,
    kEkva,
    kEkvaRandomGroups,
    kEkvaNoGroup,
    kEkvaOnline
  };
  struct SequenceBudgets {
    std::vector<int> head;   // [layer][kv head]
    std::vector<int> group;  // [layer][kv head][group]; empty unless grouped
    int steps = 0;           // decode steps since compression
  };

  int group_of(int layer, const TokenMeta& meta) const;
  bool grouped() const {
    return kind_ == Kind::kEkva || kind_ == Kind::kEkvaRandomGroups || kind_ == Kind::kEkvaOnline;
  }
  // ekva-online: group budgets follow the attention mass each group's retained tokens drew so far.
  void refresh_group_budgets(const KvCache& cache, int seq);
  void plan_budgets(const KvCache& cache, int seq, int prompt_len);
  std::vector<int> select(const KvCache& cache, int seq, int layer, int kv_head, int prompt_len,
                          int keep) const;
  int victim(const KvCache& cache, int seq, int layer, int kv_head) const;

  PolicyOptions options_;
  Kind kind_;
  int num_layers_;
  int num_kv_heads_;
  int num_groups_;
  std::vector<SequenceBudgets> budgets_;  // per sequence
};

// Max-pools the scores of one (sequence, layer, KV head) over positions, as SnapKV smooths its
// votes.
void pool_scores(HeadTable& table, int kernel);

}  // namespace ekva
