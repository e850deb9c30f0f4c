#pragma once
// BudgetPlan: how many KV tokens each (layer, KV head, expert group) keeps. Versioned JSON, schema
// in docs/BUDGET_PLAN.md. Calibration writes plans; policies, the roofline model and eval read
// them.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arch/model_spec.h"
#include "kv/surprisal.h"

namespace ekva {

class BudgetPlan {
 public:
  static constexpr int kVersion = 1;
  enum class Unit { kFraction, kTokens };  // budgets as a fraction of the prompt, or token counts

  BudgetPlan(const ModelSpec& spec, int num_groups, Unit unit);
  // A plan whose every (layer, KV head) keeps `per_head` (a fraction or tokens), split evenly over
  // groups.
  static BudgetPlan uniform(const ModelSpec& spec, int num_groups, Unit unit, double per_head);

  static BudgetPlan from_json(const nlohmann::json& j, const std::string& source);
  static BudgetPlan load(const std::filesystem::path& path);
  nlohmann::json to_json() const;
  void save(const std::filesystem::path& path) const;

  // Throws kInvalidArgument when the plan was made for a model of another shape.
  void check_model(const ModelSpec& spec) const;

  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int num_groups() const { return num_groups_; }
  int num_experts() const { return num_experts_; }
  Unit unit() const { return unit_; }
  const std::string& model_type() const { return model_type_; }

  double budget(int layer, int kv_head, int group) const {
    return budgets_[index(layer, kv_head, group)];
  }
  void set_budget(int layer, int kv_head, int group, double value);
  // Tokens group `group` of (layer, KV head) keeps when the prompt has `context` tokens.
  double group_tokens(int layer, int kv_head, int group, int64_t context) const;
  // The same summed over expert groups.
  double retained_tokens(int layer, int kv_head, int64_t context) const;

  // Experts map to groups per layer; identity when num_groups == num_experts, else contiguous
  // blocks until set_expert_group() says otherwise.
  int group_of(int layer, int expert) const {
    return expert_group_[static_cast<size_t>(layer) * num_experts_ + expert];
  }
  void set_expert_group(int layer, int expert, int group);

  int sink_tokens = 0;    // the first tokens of a prompt, always kept on top of the budgets
  int recent_tokens = 0;  // the most recent tokens, always kept on top of the budgets
  // The surprisal reserve of ekva and its controls; a plan written before it existed loads with
  // the defaults, and a policy's own options override it field by field.
  ReserveOptions reserve;
  nlohmann::json provenance = nlohmann::json::object();

 private:
  size_t index(int layer, int kv_head, int group) const {
    return (static_cast<size_t>(layer) * num_kv_heads_ + kv_head) * num_groups_ + group;
  }

  std::string model_type_;
  int num_layers_;
  int num_kv_heads_;
  int num_experts_;
  int num_groups_;
  Unit unit_;
  std::vector<double> budgets_;
  std::vector<int> expert_group_;
};

}  // namespace ekva
