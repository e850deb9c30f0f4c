#include "kv/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a stable hash for the random-label ablation
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const std::vector<std::string>& KvPolicy::names() {
  static const std::vector<std::string> n = {
      "full",         "streaming",   "h2o",          "snapkv",     "pyramidkv",
      "adakv",        "keydiff",     "ekva",         "ekva-quota", "ekva-random-groups",
      "ekva-nogroup", "ekva-online", "rarity-tokens"};
  return n;
}

KvPolicy::KvPolicy(const PolicyOptions& options, const ModelSpec& spec)
    : options_(options),
      num_layers_(spec.num_layers),
      num_kv_heads_(spec.num_kv_heads),
      spec_(spec) {
  static const Kind kinds[] = {Kind::kFull,        Kind::kStreaming,
                               Kind::kH2o,         Kind::kSnapKv,
                               Kind::kPyramidKv,   Kind::kAdaKv,
                               Kind::kKeyDiff,     Kind::kEkva,
                               Kind::kEkvaQuota,   Kind::kEkvaRandomGroups,
                               Kind::kEkvaNoGroup, Kind::kEkvaOnline,
                               Kind::kRarityTokens};
  const auto it = std::find(names().begin(), names().end(), options.name);
  if (it == names().end()) {
    fail(ErrorKind::kInvalidArgument, "unknown KV policy '{}' (known: {})", options.name,
         fmt::join(names(), ", "));
  }
  kind_ = kinds[it - names().begin()];
  if (options.budget) mean_head_budget(spec, *options.budget, 1);  // rejects a bad budget now
  if (options.window < 0 || options.sinks < 0 || options.pool_kernel < 1 || options.ada_floor < 0 ||
      options.ada_floor > 1 || options.refresh < 1) {
    fail(ErrorKind::kInvalidArgument,
         "KV policy: window, sinks must be >= 0, pool kernel >= 1, ada floor in [0, 1]");
  }
  if (options.plan) {
    options.plan->check_model(spec);
    reserve_ = options.plan->reserve;
  }
  if (options.reserve.threshold) reserve_.threshold = *options.reserve.threshold;
  if (options.reserve.cap) reserve_.cap = *options.reserve.cap;
  if (options.reserve.span) reserve_.span = *options.reserve.span;
  if (!std::isfinite(reserve_.threshold) || !(reserve_.cap >= 0.0) || reserve_.cap > 1.0 ||
      reserve_.span < 0) {
    fail(ErrorKind::kInvalidArgument,
         "KV policy: the reserve threshold {} must be finite, its cap {} in [0, 1] and its span {} "
         ">= 0",
         reserve_.threshold, reserve_.cap, reserve_.span);
  }
  num_groups_ = options.plan ? options.plan->num_groups() : spec.num_experts;
}

std::vector<uint8_t> KvPolicy::prefill_score_queries(int prompt_len) const {
  std::vector<uint8_t> q(prompt_len, 0);
  switch (kind_) {
    case Kind::kFull:
    case Kind::kStreaming:
    case Kind::kKeyDiff:  // ranks keys, not attention
      break;
    case Kind::kH2o:
      std::fill(q.begin(), q.end(), 1);
      break;
    default:  // SnapKV and every policy that selects with its scores: the observation window votes
      for (int t = std::max(0, prompt_len - std::max(options_.window, 1)); t < prompt_len; ++t)
        q[t] = 1;
  }
  return q;
}

bool KvPolicy::scores_decode() const {
  return kind_ != Kind::kFull && kind_ != Kind::kStreaming && kind_ != Kind::kKeyDiff;
}

void KvPolicy::score_keys(KvLayout& layout, const KvPages& pages, int seq) const {
  if (!ranks_keys()) return;
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) score_key_distinctness(layout.table(seq, l, h), pages);
  }
}

void score_key_distinctness(HeadTable& table, const KvPages& pages) {
  const int n = table.size(), d = pages.head_dim(), page = pages.page_size();
  std::vector<float> scratch(d);
  auto key = [&](int slot) {
    return pages.key({table.pages[slot / page], slot % page}, scratch.data());
  };
  auto norm = [d](const float* v) {
    double sq = 0.0;
    for (int i = 0; i < d; ++i) sq += static_cast<double>(v[i]) * v[i];
    return std::sqrt(sq);
  };
  std::vector<double> anchor(d, 0.0);
  for (int slot = 0; slot < n; ++slot) {
    const float* k = key(slot);
    const double length = norm(k);
    if (length == 0.0) continue;
    for (int i = 0; i < d; ++i) anchor[i] += k[i] / length;
  }
  double anchor_length = 0.0;
  for (double a : anchor) anchor_length += a * a;
  anchor_length = std::sqrt(anchor_length);
  for (int slot = 0; slot < n; ++slot) {
    const float* k = key(slot);
    const double length = norm(k);
    double dot = 0.0;
    for (int i = 0; i < d; ++i) dot += anchor[i] * k[i];
    table.meta[slot].score = length == 0.0 || anchor_length == 0.0
                                 ? 0.0f
                                 : static_cast<float>(-dot / (length * anchor_length));
  }
}

std::vector<double> KvPolicy::surprisal(const PromptRouting& prompt, int prompt_len) const {
  if (kind_ == Kind::kRarityTokens) {
    if (static_cast<int>(prompt.tokens.size()) != prompt_len) {
      fail(ErrorKind::kInvalidArgument, "KV policy {}: {} prompt token ids for a prompt of {}",
           options_.name, prompt.tokens.size(), prompt_len);
    }
    return token_rarity_surprisal(prompt.tokens);
  }
  if (kind_ == Kind::kEkva) return routing_surprisal(prompt.layers, prompt_len);
  // ekva-random-groups: the same surprisal over expert labels drawn at random per (layer,
  // position), with the real routers' top-k, so only the information in the routing is removed.
  std::vector<LayerRouting> random = prompt.layers;
  for (size_t l = 0; l < random.size(); ++l) {
    LayerRouting& r = random[l];
    const uint64_t experts = static_cast<uint64_t>(std::max(spec_.num_experts, r.top_k));
    for (int t = 0; t < prompt_len; ++t) {
      int32_t* chosen = r.experts.data() + static_cast<size_t>(t) * r.top_k;
      for (int i = 0; i < r.top_k; ++i) {
        uint64_t draw = mix(options_.seed ^ (l << 48) ^ (static_cast<uint64_t>(t) << 8) ^ i);
        int32_t e;
        do {  // distinct experts within a token's top-k
          e = static_cast<int32_t>(draw % experts);
          draw = mix(draw);
        } while (std::find(chosen, chosen + i, e) != chosen + i);
        chosen[i] = e;
      }
      if (!r.gates.empty()) {
        std::fill_n(r.gates.begin() + static_cast<ptrdiff_t>(t) * r.top_k, r.top_k,
                    1.0f / static_cast<float>(r.top_k));
      }
    }
  }
  return routing_surprisal(random, prompt_len);
}

int KvPolicy::group_of(int layer, const TokenMeta& meta) const {
  if (meta.expert < 0) return 0;  // dense layers have no routing: one group
  return options_.plan ? options_.plan->group_of(layer, meta.expert) : meta.expert % num_groups_;
}

int KvPolicy::head_budget(int seq, int layer, int kv_head) const {
  const KvBudgets& b = budgets_.at(seq).budgets;
  return b.at(layer, kv_head, num_kv_heads_) + b.sinks + b.recent;
}

void KvPolicy::plan_budgets(const KvLayout& layout, int seq, int prompt_len) {
  const int L = num_layers_, H = num_kv_heads_;
  // Only the ekva family and its controls read a plan; the baselines split their budget their own
  // way.
  const BudgetPlan* plan = uses_plan() && options_.plan ? &*options_.plan : nullptr;
  SequenceBudgets b;
  b.budgets = resolve_budgets(spec_, plan, options_.budget, prompt_len);
  std::vector<int>& head = b.budgets.head;
  const int base = head.empty() ? 1 : head[0];  // without a plan every head starts equal
  if (head_adaptive()) {
    // Ada-KV: per layer, a floor per head, then the rest of the layer's budget goes to the best
    // (pooled) scores across its heads. The layers are apart, so a long prompt's run on all
    // threads.
    [[maybe_unused]] const bool parallel =
        static_cast<int64_t>(layout.retained_tokens(seq)) >= kParallelSlots;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int l = 0; l < L; ++l) {
      int64_t layer_total = 0;
      for (int h = 0; h < H; ++h) layer_total += head[static_cast<size_t>(l) * H + h];
      const int floor =
          static_cast<int>(std::floor(options_.ada_floor * static_cast<double>(layer_total) / H));
      std::vector<std::pair<float, int>> candidates;
      for (int h = 0; h < H; ++h) {
        HeadTable pooled = layout.table(seq, l, h);
        pool_scores(pooled, options_.pool_kernel);
        std::vector<float> s;
        for (const TokenMeta& m : pooled.meta) s.push_back(m.score);
        // Only which scores pass the floor and which candidates come first matter, not their
        // order: selections rather than sorts (the same sets, equal values being alike).
        if (static_cast<size_t>(floor) < s.size())
          std::nth_element(s.begin(), s.begin() + floor, s.end(), std::greater<>());
        for (size_t i = floor; i < s.size(); ++i) candidates.emplace_back(s[i], h);
      }
      const int extra = static_cast<int>(std::min<int64_t>(
          layer_total - static_cast<int64_t>(floor) * H, static_cast<int64_t>(candidates.size())));
      std::nth_element(candidates.begin(), candidates.begin() + extra, candidates.end(),
                       std::greater<>());
      for (int h = 0; h < H; ++h) head[static_cast<size_t>(l) * H + h] = std::max(1, floor);
      for (int i = 0; i < extra; ++i) ++head[static_cast<size_t>(l) * H + candidates[i].second];
    }
  }
  switch (kind_) {
    case Kind::kPyramidKv: {
      // Budgets shrink linearly with depth, from 1.5x to 0.5x the mean, summing to L x base per
      // head.
      std::vector<double> w(L);
      for (int l = 0; l < L; ++l) w[l] = L == 1 ? 1.0 : 1.5 - static_cast<double>(l) / (L - 1);
      const std::vector<int> per_layer = apportion(static_cast<int64_t>(base) * L, w);
      for (int l = 0; l < L; ++l) {
        for (int h = 0; h < H; ++h)
          head[static_cast<size_t>(l) * H + h] = std::max(1, per_layer[l]);
      }
    } break;
    default:
      break;
  }
  if (grouped()) {
    const int G = num_groups_;
    b.group.resize(static_cast<size_t>(L) * H * G);
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        std::vector<double> w(G, 1.0);
        if (plan != nullptr) {
          for (int g = 0; g < G; ++g) w[g] = plan->group_tokens(l, h, g, prompt_len);
        }
        const int budget = head[static_cast<size_t>(l) * H + h];
        const std::vector<int> q = apportion(budget - std::min(options_.window, budget), w);
        std::copy(q.begin(), q.end(), b.group.begin() + (static_cast<ptrdiff_t>(l) * H + h) * G);
      }
    }
  }
  if (static_cast<int>(budgets_.size()) <= seq) budgets_.resize(seq + 1);
  budgets_[seq] = std::move(b);
}

SegmentEviction KvPolicy::segment(const KvLayout& layout, int seq, int layer, int kv_head,
                                  int32_t end) const {
  const SequenceBudgets& b = budgets_[seq];
  const int budget = b.budgets.at(layer, kv_head, num_kv_heads_);
  SegmentEviction s;
  s.layer = layer;
  s.kv_head = kv_head;
  s.keep = budget + b.budgets.sinks + b.budgets.recent;
  int recent;
  if (kind_ == Kind::kStreaming) {
    const int sinks = std::min(options_.sinks, budget);
    s.sinks = sinks + b.budgets.sinks;
    recent = budget - sinks + b.budgets.recent;
  } else {
    s.sinks = b.budgets.sinks;
    recent = std::min(options_.window, budget) + b.budgets.recent;
  }
  s.recent_from = end - recent;
  if (!b.reserve.empty()) {
    // The reserve takes at most its cap of the room the window leaves, so that the protected
    // tokens never exceed the budget.
    const int room = budget - std::min(options_.window, budget);
    const size_t n = std::min(reserve_limit(reserve_.cap, room), b.reserve.size());
    s.pinned.assign(b.reserve.begin(), b.reserve.begin() + static_cast<ptrdiff_t>(n));
    std::sort(s.pinned.begin(), s.pinned.end());
  }
  if (grouped()) {
    const int G = num_groups_;
    const int* quota = b.group.data() + (static_cast<size_t>(layer) * num_kv_heads_ + kv_head) * G;
    s.quota.assign(quota, quota + G);
    const HeadTable& t = layout.table(seq, layer, kv_head);
    s.slot_group.reserve(t.size());
    for (const TokenMeta& m : t.meta)
      s.slot_group.push_back(static_cast<int16_t>(group_of(layer, m)));
  }
  return s;
}

EvictionPlan KvPolicy::compress(const KvLayout& layout, int seq, int prompt_len,
                                const PromptRouting& prompt) {
  EvictionPlan plan;
  plan.seq = seq;
  if (kind_ == Kind::kFull) return plan;
  plan_budgets(layout, seq, prompt_len);
  if (reserves()) {
    budgets_[seq].reserve = reserve_candidates(surprisal(prompt, prompt_len), reserve_);
  }
  plan.pool_kernel = pools_scores() ? options_.pool_kernel : 1;
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      if (layout.table(seq, l, h).size() <= head_budget(seq, l, h)) continue;
      plan.segments.push_back(segment(layout, seq, l, h, prompt_len));
    }
  }
  return plan;
}

void KvPolicy::refresh_group_budgets(const KvLayout& layout, int seq) {
  const int G = num_groups_;
  SequenceBudgets& b = budgets_[seq];
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      std::vector<double> mass(G, 1e-6);  // a group that drew nothing keeps a share of zero tokens
      for (const TokenMeta& m : layout.table(seq, l, h).meta) mass[group_of(l, m)] += m.score;
      const int budget = b.budgets.at(l, h, num_kv_heads_);
      const std::vector<int> q = apportion(budget - std::min(options_.window, budget), mass);
      std::copy(q.begin(), q.end(),
                b.group.begin() + (static_cast<ptrdiff_t>(l) * num_kv_heads_ + h) * G);
    }
  }
}

EvictionPlan KvPolicy::evict(const KvLayout& layout, int seq) {
  EvictionPlan plan;
  plan.seq = seq;
  if (kind_ == Kind::kFull) return plan;
  if (seq >= static_cast<int>(budgets_.size()) || budgets_[seq].budgets.head.empty()) {
    fail(ErrorKind::kInvalidArgument, "KV policy: sequence {} was never compressed", seq);
  }
  if (kind_ == Kind::kEkvaOnline && ++budgets_[seq].steps % options_.refresh == 0) {
    refresh_group_budgets(layout, seq);
  }
  const int32_t end = layout.next_position(seq);
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      if (layout.table(seq, l, h).size() <= head_budget(seq, l, h)) continue;
      plan.segments.push_back(segment(layout, seq, l, h, end));
    }
  }
  return plan;
}

}  // namespace ekva
