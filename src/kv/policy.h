#pragma once
// KV compression policies: which retained tokens each (sequence, layer, KV head) keeps after
// prefill and which it evicts during decode. A policy reads the layout's metadata (positions,
// routing, scores) and decides; it returns an EvictionPlan that a backend executes, and never
// touches K/V storage. Policies differ in the scores they rank by and in how the budget (one
// meaning, kv_budget.h) is split over layers, heads and expert groups. The scores are attention
// that backends accumulate, except for keydiff, whose scores are read off the cached keys on the
// host (score_keys), so that selection stays the one select_evictions every backend reproduces.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kv/budget_plan.h"
#include "kv/eviction_plan.h"
#include "kv/kv_budget.h"
#include "kv/kv_layout.h"
#include "kv/kv_pages.h"
#include "kv/surprisal.h"

namespace ekva {

// The surprisal reserve's parameters as a caller gives them: an unset field takes the plan's value
// (BudgetPlan::reserve), or ReserveOptions' default without a plan, so that a command line
// overrides a plan field by field.
struct ReserveOverrides {
  std::optional<double> threshold;
  std::optional<double> cap;
  std::optional<int> span;
};

struct PolicyOptions {
  std::string name = "full";
  // kv_budget.h: <= 1 a fraction of the prompt, > 1 tokens per (layer, KV head); none: the plan's
  // own budgets, or everything without a plan. Fixed when the prompt is compressed.
  std::optional<double> budget;
  int window = 16;         // most recent tokens always kept; SnapKV's observation window
  int sinks = 4;           // streaming: the first tokens, always kept
  int pool_kernel = 7;     // SnapKV: max-pool width over positions
  double ada_floor = 0.2;  // Ada-KV: each head keeps at least this share of the mean head budget
  int refresh = 64;        // ekva-online: decode steps between group-budget refreshes
  // ekva, ekva-random-groups, rarity-tokens: the surprisal reserve (surprisal.h)
  ReserveOverrides reserve;
  std::optional<BudgetPlan> plan;  // budgets per (layer, head, group); ekva's groups
  uint64_t seed = 0;               // ekva-random-groups: the random expert labels
};

// What a prompt was, for policies that read more than the layout's metadata: its token ids and
// each MoE layer's routing of it (experts and gates per token).
struct PromptRouting {
  std::vector<int32_t> tokens;
  std::vector<LayerRouting> layers;
};

class KvPolicy {
 public:
  // Throws kInvalidArgument for an unknown name (listing the known ones), a budget that is not
  // positive, or a plan made for another model.
  KvPolicy(const PolicyOptions& options, const ModelSpec& spec);
  static const std::vector<std::string>& names();

  const PolicyOptions& options() const { return options_; }
  // The surprisal reserve's parameters in force: the options' overrides over the plan's values.
  const ReserveOptions& reserve() const { return reserve_; }
  bool keeps_everything() const { return kind_ == Kind::kFull; }
  // Whether the policy ranks slots by their cached keys (keydiff) rather than by attention: its
  // scores must then be refreshed from host K pages (score_keys) before each compression and
  // eviction, which a backend that keeps K on a device only cannot serve.
  bool ranks_keys() const { return kind_ == Kind::kKeyDiff; }
  // keydiff: every retained slot of `seq` scored by score_key_distinctness; nothing otherwise.
  void score_keys(KvLayout& layout, const KvPages& pages, int seq) const;
  // Per prompt token: 1 when its attention should feed the retention scores during prefill.
  std::vector<uint8_t> prefill_score_queries(int prompt_len) const;
  // Whether decode queries add their attention to the scores.
  bool scores_decode() const;
  // Whether its decode evictions read the slots' scores on the host (expert-group quotas, which a
  // device does not select by): a backend that keeps the scores must copy them first.
  bool evicts_by_groups() const { return grouped(); }
  // Right after a sequence's prompt of prompt_len tokens was prefilled: fixes the budgets that
  // decode-time eviction then holds, and says what to evict now.
  EvictionPlan compress(const KvLayout& layout, int seq, int prompt_len,
                        const PromptRouting& prompt = {});
  // After a decode step appended one token per (layer, KV head): brings every segment back within
  // its budget, all segments in one plan.
  EvictionPlan evict(const KvLayout& layout, int seq);
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
    kKeyDiff,
    kEkva,
    kEkvaQuota,
    kEkvaRandomGroups,
    kEkvaNoGroup,
    kEkvaOnline,
    kRarityTokens
  };
  struct SequenceBudgets {
    KvBudgets budgets;         // per (layer, KV head), before the plan's sinks and recent
    std::vector<int> group;    // [layer][kv head][group]; empty unless grouped
    std::vector<int> reserve;  // surprisal outliers, most surprising first (reserving policies)
    int steps = 0;             // decode steps since compression
  };

  int group_of(int layer, const TokenMeta& meta) const;
  bool grouped() const { return kind_ == Kind::kEkvaQuota || kind_ == Kind::kEkvaOnline; }
  bool reserves() const {
    return kind_ == Kind::kEkva || kind_ == Kind::kEkvaRandomGroups || kind_ == Kind::kRarityTokens;
  }
  bool head_adaptive() const { return kind_ == Kind::kAdaKv || reserves(); }
  bool uses_plan() const { return kind_ >= Kind::kEkva && kind_ <= Kind::kRarityTokens; }
  std::vector<double> surprisal(const PromptRouting& prompt, int prompt_len) const;
  bool pools_scores() const {
    return kind_ != Kind::kStreaming && kind_ != Kind::kH2o && kind_ != Kind::kKeyDiff;
  }
  // ekva-online: group budgets follow the attention mass each group's retained tokens drew so far.
  void refresh_group_budgets(const KvLayout& layout, int seq);
  void plan_budgets(const KvLayout& layout, int seq, int prompt_len);
  // The eviction of one segment whose newest position is end - 1.
  SegmentEviction segment(const KvLayout& layout, int seq, int layer, int kv_head,
                          int32_t end) const;

  PolicyOptions options_;
  ReserveOptions reserve_;
  Kind kind_;
  int num_layers_;
  int num_kv_heads_;
  int num_groups_;
  ModelSpec spec_;
  std::vector<SequenceBudgets> budgets_;  // per sequence
};

// KeyDiff (2025): keys unlike the rest of their head's cache draw attention that no other key can
// stand in for, whatever the query, so the least similar keys are the ones to keep. Sets each
// slot's score to -cos(k, a), where the anchor a is the mean of the table's keys scaled to unit
// length (the paper's anchor: unit keys, so that a few long keys do not pull it their way). A zero
// key or a zero anchor has no direction and scores 0.
void score_key_distinctness(HeadTable& table, const KvPages& pages);

}  // namespace ekva
