#include "kv/budget_plan.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"
#include "io/json_file.h"
#include "io/model_limits.h"

namespace ekva {

using nlohmann::json;

BudgetPlan::BudgetPlan(const ModelSpec& spec, int num_groups, Unit unit)
    : model_type_(spec.model_type),
      num_layers_(spec.num_layers),
      num_kv_heads_(spec.num_kv_heads),
      num_experts_(spec.num_experts),
      num_groups_(num_groups),
      unit_(unit) {
  if (num_groups <= 0 || num_groups > spec.num_experts) {
    fail(ErrorKind::kInvalidArgument, "budget plan: {} expert groups for a model with {} experts",
         num_groups, spec.num_experts);
  }
  budgets_.assign(static_cast<size_t>(num_layers_) * num_kv_heads_ * num_groups_, 0.0);
  expert_group_.resize(static_cast<size_t>(num_layers_) * num_experts_);
  for (int l = 0; l < num_layers_; ++l) {
    for (int e = 0; e < num_experts_; ++e) {
      expert_group_[static_cast<size_t>(l) * num_experts_ + e] = e * num_groups_ / num_experts_;
    }
  }
}

BudgetPlan BudgetPlan::uniform(const ModelSpec& spec, int num_groups, Unit unit, double per_head) {
  BudgetPlan plan(spec, num_groups, unit);
  for (int l = 0; l < plan.num_layers_; ++l) {
    for (int h = 0; h < plan.num_kv_heads_; ++h) {
      for (int g = 0; g < num_groups; ++g) plan.set_budget(l, h, g, per_head / num_groups);
    }
  }
  plan.provenance = {{"allocator", "uniform"}, {"per_head", per_head}};
  return plan;
}

void BudgetPlan::set_budget(int layer, int kv_head, int group, double value) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    fail(ErrorKind::kInvalidArgument,
         "budget plan: budget of layer {} head {} group {} is {}; must be >= 0", layer, kv_head,
         group, value);
  }
  if (unit_ == Unit::kFraction && value > 1.0) {
    fail(ErrorKind::kInvalidArgument,
         "budget plan: fraction {} of layer {} head {} group {} exceeds 1", value, layer, kv_head,
         group);
  }
  budgets_[index(layer, kv_head, group)] = value;
}

void BudgetPlan::set_expert_group(int layer, int expert, int group) {
  if (group < 0 || group >= num_groups_) {
    fail(ErrorKind::kInvalidArgument, "budget plan: expert {} of layer {} mapped to group {} of {}",
         expert, layer, group, num_groups_);
  }
  expert_group_[static_cast<size_t>(layer) * num_experts_ + expert] = group;
}

double BudgetPlan::group_tokens(int layer, int kv_head, int group, int64_t context) const {
  const double b = budget(layer, kv_head, group);
  return unit_ == Unit::kFraction ? b * static_cast<double>(context) : b;
}

double BudgetPlan::retained_tokens(int layer, int kv_head, int64_t context) const {
  double total = 0.0;
  for (int g = 0; g < num_groups_; ++g) total += group_tokens(layer, kv_head, g, context);
  return total;
}

void BudgetPlan::check_model(const ModelSpec& spec) const {
  if (spec.model_type != model_type_ || spec.num_layers != num_layers_ ||
      spec.num_kv_heads != num_kv_heads_ || spec.num_experts != num_experts_) {
    fail(ErrorKind::kInvalidArgument,
         "budget plan is for a {} model with {} layers, {} KV heads and {} experts, not this {} "
         "model with {}, "
         "{} and {}",
         model_type_, num_layers_, num_kv_heads_, num_experts_, spec.model_type, spec.num_layers,
         spec.num_kv_heads, spec.num_experts);
  }
}

json BudgetPlan::to_json() const {
  json budgets = json::array();
  for (int l = 0; l < num_layers_; ++l) {
    json heads = json::array();
    for (int h = 0; h < num_kv_heads_; ++h) {
      json groups = json::array();
      for (int g = 0; g < num_groups_; ++g) groups.push_back(budget(l, h, g));
      heads.push_back(groups);
    }
    budgets.push_back(heads);
  }
  json groups = json::array();
  for (int l = 0; l < num_layers_; ++l) {
    groups.push_back(
        std::vector<int>(expert_group_.begin() + static_cast<ptrdiff_t>(l) * num_experts_,
                         expert_group_.begin() + static_cast<ptrdiff_t>(l + 1) * num_experts_));
  }
  return {
      {"format", "ekva.budget_plan"},
      {"version", kVersion},
      {"model",
       {{"model_type", model_type_},
        {"num_layers", num_layers_},
        {"num_kv_heads", num_kv_heads_},
        {"num_experts", num_experts_}}},
      {"num_groups", num_groups_},
      {"expert_groups", groups},
      {"unit", unit_ == Unit::kFraction ? "fraction" : "tokens"},
      {"sink_tokens", sink_tokens},
      {"recent_tokens", recent_tokens},
      {"reserve", {{"threshold", reserve.threshold}, {"cap", reserve.cap}, {"span", reserve.span}}},
      {"budgets", budgets},
      {"provenance", provenance}};
}

void BudgetPlan::save(const std::filesystem::path& path) const {
  write_text_file(path, to_json().dump(1) + "\n");
}

BudgetPlan BudgetPlan::load(const std::filesystem::path& path) {
  return from_json(read_json_file(path), path.string());
}

namespace {

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

const json& field(const json& j, const char* key, const std::string& source) {
  if (!j.is_object() || !j.contains(key))
    fail(ErrorKind::kInvalidFile, "{}: missing field '{}'", source, key);
  return j[key];
}

// An integer in [0, max]: shapes are bounded before anything is sized from them, and nothing is
// narrowed silently.
int int_field(const json& j, const char* key, const std::string& source, int64_t max) {
  const json& v = field(j, key, source);
  if (!json_integer_in(v, 0, max)) {
    fail(ErrorKind::kInvalidFile, "{}: field '{}' must be an integer in [0, {}]", source, key, max);
  }
  return static_cast<int>(v.get<int64_t>());
}

std::string string_field(const json& j, const char* key, const std::string& source) {
  const json& v = field(j, key, source);
  if (!v.is_string()) fail(ErrorKind::kInvalidFile, "{}: field '{}' is not a string", source, key);
  return v.get<std::string>();
}

// Each field may be left out (its default then applies); a misspelt one is refused rather than
// silently left at its default.
ReserveOptions reserve_field(const json& r, const std::string& source) {
  if (!r.is_object()) {
    fail(ErrorKind::kInvalidFile, "{}: field 'reserve' must be an object, not {}", source,
         json_excerpt(r));
  }
  for (const auto& item : r.items()) {
    if (item.key() != "threshold" && item.key() != "cap" && item.key() != "span") {
      fail(ErrorKind::kInvalidFile,
           "{}: field 'reserve.{}' is unknown (known: threshold, cap, span)", source, item.key());
    }
  }
  ReserveOptions reserve;
  if (r.contains("threshold")) {
    const json& v = r["threshold"];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      fail(ErrorKind::kInvalidFile, "{}: field 'reserve.threshold' must be a finite number, not {}",
           source, json_excerpt(v));
    }
    reserve.threshold = v.get<double>();
  }
  if (r.contains("cap")) {
    const json& v = r["cap"];
    if (!v.is_number() || !(v.get<double>() >= 0.0 && v.get<double>() <= 1.0)) {
      fail(ErrorKind::kInvalidFile, "{}: field 'reserve.cap' must be a number in [0, 1], not {}",
           source, json_excerpt(v));
    }
    reserve.cap = v.get<double>();
  }
  if (r.contains("span")) {
    const json& v = r["span"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxInt) {
      fail(ErrorKind::kInvalidFile, "{}: field 'reserve.span' must be an integer >= 0, not {}",
           source, json_excerpt(v));
    }
    reserve.span = v.get<int>();
  }
  return reserve;
}

}  // namespace

BudgetPlan BudgetPlan::from_json(const json& j, const std::string& source) {
  if (field(j, "format", source) != "ekva.budget_plan") {
    fail(ErrorKind::kInvalidFile, "{}: format is not 'ekva.budget_plan'", source);
  }
  const int version = int_field(j, "version", source, kMaxInt);
  if (version != kVersion) {
    fail(ErrorKind::kUnsupported, "{}: budget plan version {} (this build reads version {})",
         source, version, kVersion);
  }
  const json& m = field(j, "model", source);
  ModelSpec shape;
  shape.model_type = string_field(m, "model_type", source);
  shape.num_layers = int_field(m, "num_layers", source, model_limits::kLayers);
  shape.num_kv_heads = int_field(m, "num_kv_heads", source, model_limits::kHeads);
  shape.num_experts = int_field(m, "num_experts", source, model_limits::kExperts);
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.num_experts <= 0) {
    fail(ErrorKind::kInvalidFile, "{}: model shape must be positive", source);
  }
  const std::string unit = string_field(j, "unit", source);
  if (unit != "fraction" && unit != "tokens") {
    fail(ErrorKind::kInvalidFile, "{}: unit '{}' (expected 'fraction' or 'tokens')", source, unit);
  }
  const int num_groups = int_field(j, "num_groups", source, model_limits::kExperts);
  // The budgets' shape is checked before the plan is sized from the model's, so that the plan
  // holds no more numbers than the file does.
  const json& budgets = field(j, "budgets", source);
  if (!budgets.is_array() || static_cast<int>(budgets.size()) != shape.num_layers) {
    fail(ErrorKind::kInvalidFile, "{}: budgets must list {} layers", source, shape.num_layers);
  }
  for (int l = 0; l < shape.num_layers; ++l) {
    const json& heads = budgets[l];
    if (!heads.is_array() || static_cast<int>(heads.size()) != shape.num_kv_heads) {
      fail(ErrorKind::kInvalidFile, "{}: budgets[{}] must list {} KV heads", source, l,
           shape.num_kv_heads);
    }
    for (int h = 0; h < shape.num_kv_heads; ++h) {
      if (!heads[h].is_array() || static_cast<int>(heads[h].size()) != num_groups) {
        fail(ErrorKind::kInvalidFile, "{}: budgets[{}][{}] must list {} groups", source, l, h,
             num_groups);
      }
    }
  }
  BudgetPlan plan(shape, num_groups, unit == "fraction" ? Unit::kFraction : Unit::kTokens);
  plan.sink_tokens = int_field(j, "sink_tokens", source, kMaxInt);
  plan.recent_tokens = int_field(j, "recent_tokens", source, kMaxInt);
  for (int l = 0; l < plan.num_layers_; ++l) {
    for (int h = 0; h < plan.num_kv_heads_; ++h) {
      const json& groups = budgets[l][h];
      for (int g = 0; g < plan.num_groups_; ++g) {
        if (!groups[g].is_number()) {
          fail(ErrorKind::kInvalidFile, "{}: budgets[{}][{}][{}] is not a number", source, l, h, g);
        }
        try {
          plan.set_budget(l, h, g, groups[g].get<double>());
        } catch (const Error& e) {
          fail(ErrorKind::kInvalidFile, "{}: {}", source, e.what());
        }
      }
    }
  }
  if (j.contains("expert_groups")) {
    const json& eg = j["expert_groups"];
    if (!eg.is_array() || static_cast<int>(eg.size()) != plan.num_layers_) {
      fail(ErrorKind::kInvalidFile, "{}: expert_groups must list {} layers", source,
           plan.num_layers_);
    }
    for (int l = 0; l < plan.num_layers_; ++l) {
      if (!eg[l].is_array() || static_cast<int>(eg[l].size()) != plan.num_experts_) {
        fail(ErrorKind::kInvalidFile, "{}: expert_groups[{}] must map {} experts", source, l,
             plan.num_experts_);
      }
      for (int e = 0; e < plan.num_experts_; ++e) {
        const json& group = eg[l][e];
        if (!json_integer_in(group, 0, plan.num_groups_ - 1)) {
          fail(ErrorKind::kInvalidFile,
               "{}: expert_groups[{}][{}] names group {}, not one in [0, {})", source, l, e,
               json_excerpt(group), plan.num_groups_);
        }
        try {
          plan.set_expert_group(l, e, static_cast<int>(group.get<int64_t>()));
        } catch (const Error& err) {
          fail(ErrorKind::kInvalidFile, "{}: {}", source, err.what());
        }
      }
    }
  }
  if (j.contains("reserve")) plan.reserve = reserve_field(j["reserve"], source);
  if (j.contains("provenance")) plan.provenance = j["provenance"];
  return plan;
}

}  // namespace ekva
