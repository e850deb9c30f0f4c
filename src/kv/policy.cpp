#include "kv/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace ekva {
namespace {

// Splits `total` into integers proportional to `weights` that sum exactly to `total` (largest
// remainder).
std::vector<int> apportion(int total, const std::vector<double>& weights) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int> out(weights.size(), 0);
  if (weights.empty() || total <= 0) return out;
  std::vector<std::pair<double, size_t>> remainders;
  int given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact =
        sum > 0 ? total * weights[i] / sum : static_cast<double>(total) / weights.size();
    out[i] = static_cast<int>(std::floor(exact));
    given += out[i];
    remainders.emplace_back(exact - out[i], i);
  }
  std::sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (int i = 0; i < total - given; ++i) ++out[remainders[i % remainders.size()].second];
  return out;
}

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a stable hash for the random-label ablation
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const std::vector<std::string>& KvPolicy::names() {
  static const std::vector<std::string> n = {
      "full", "streaming",          "h2o",          "snapkv",     "pyramidkv", "adakv",
      "ekva", "ekva-random-groups", "ekva-nogroup", "ekva-online"};
  return n;
}

KvPolicy::KvPolicy(const PolicyOptions& options, const ModelSpec& spec)
    : options_(options), num_layers_(spec.num_layers), num_kv_heads_(spec.num_kv_heads) {
  static const Kind kinds[] = {Kind::kFull,      Kind::kStreaming,        Kind::kH2o,
                               Kind::kSnapKv,    Kind::kPyramidKv,        Kind::kAdaKv,
                               Kind::kEkva,      Kind::kEkvaRandomGroups, Kind::kEkvaNoGroup,
                               Kind::kEkvaOnline};
  const auto it = std::find(names().begin(), names().end(), options.name);
  if (it == names().end()) {
    fail(ErrorKind::kInvalidArgument, "unknown KV policy '{}' (known: {})", options.name,
         fmt::join(names(), ", "));
  }
  kind_ = kinds[it - names().begin()];
  if (!(options.budget > 0.0) || !std::isfinite(options.budget)) {
    fail(ErrorKind::kInvalidArgument,
         "KV budget {} must be a fraction in (0, 1] or a token count > 1", options.budget);
  }
  if (options.window < 0 || options.sinks < 0 || options.pool_kernel < 1 || options.ada_floor < 0 ||
      options.ada_floor > 1 || options.refresh < 1) {
    fail(ErrorKind::kInvalidArgument,
         "KV policy: window, sinks must be >= 0, pool kernel >= 1, ada floor in [0, 1]");
  }
  if (options.plan) options.plan->check_model(spec);
  num_groups_ = options.plan ? options.plan->num_groups() : spec.num_experts;
}

std::vector<uint8_t> KvPolicy::prefill_score_queries(int prompt_len) const {
  std::vector<uint8_t> q(prompt_len, 0);
  switch (kind_) {
    case Kind::kFull:
    case Kind::kStreaming:
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
  return kind_ != Kind::kFull && kind_ != Kind::kStreaming;
}

int KvPolicy::group_of(int layer, const TokenMeta& meta) const {
  if (kind_ == Kind::kEkvaRandomGroups) {
    const int experts = options_.plan ? options_.plan->num_experts() : num_groups_;
    const int e = static_cast<int>(mix(options_.seed ^ (static_cast<uint64_t>(layer) << 32) ^
                                       static_cast<uint32_t>(meta.position)) %
                                   static_cast<uint64_t>(experts));
    return options_.plan ? options_.plan->group_of(layer, e) : e;
  }
  if (meta.expert < 0) return 0;  // dense layers have no routing: one group
  return options_.plan ? options_.plan->group_of(layer, meta.expert) : meta.expert % num_groups_;
}

int KvPolicy::head_budget(int seq, int layer, int kv_head) const {
  return budgets_.at(seq).head.at(static_cast<size_t>(layer) * num_kv_heads_ + kv_head);
}

void pool_scores(HeadTable& table, int kernel) {
  const int n = table.size();
  if (kernel <= 1 || n == 0) return;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return table.meta[a].position < table.meta[b].position; });
  std::vector<float> pooled(n);
  const int half = kernel / 2;
  for (int i = 0; i < n; ++i) {
    float m = 0.0f;
    for (int j = std::max(0, i - half); j <= std::min(n - 1, i + half); ++j)
      m = std::max(m, table.meta[order[j]].score);
    pooled[i] = m;
  }
  for (int i = 0; i < n; ++i) table.meta[order[i]].score = pooled[i];
}

void KvPolicy::plan_budgets(const KvCache& cache, int seq, int prompt_len) {
  const int L = num_layers_, H = num_kv_heads_;
  const int base = options_.budget <= 1.0
                       ? std::max(1, static_cast<int>(std::lround(options_.budget * prompt_len)))
                       : static_cast<int>(std::lround(options_.budget));
  SequenceBudgets b;
  b.head.assign(static_cast<size_t>(L) * H, base);
  switch (kind_) {
    case Kind::kPyramidKv: {
      // Budgets shrink linearly with depth, from 1.5x to 0.5x the mean, summing to L x base per
      // head.
      std::vector<double> w(L);
      for (int l = 0; l < L; ++l) w[l] = L == 1 ? 1.0 : 1.5 - static_cast<double>(l) / (L - 1);
      const std::vector<int> per_layer = apportion(base * L, w);
      for (int l = 0; l < L; ++l) {
        for (int h = 0; h < H; ++h)
          b.head[static_cast<size_t>(l) * H + h] = std::max(1, per_layer[l]);
      }
      break;
    }
    case Kind::kAdaKv: {
      // Per layer: a floor per head, then the layer's remaining budget goes to the best scores
      // across heads.
      const int floor = static_cast<int>(std::floor(options_.ada_floor * base));
      for (int l = 0; l < L; ++l) {
        std::vector<std::pair<float, int>> pool;
        for (int h = 0; h < H; ++h) {
          std::vector<float> s;
          for (const TokenMeta& m : cache.table(seq, l, h).meta) s.push_back(m.score);
          std::sort(s.begin(), s.end(), std::greater<>());
          for (size_t i = floor; i < s.size(); ++i) pool.emplace_back(s[i], h);
        }
        const int extra = std::min<int>((base - floor) * H, static_cast<int>(pool.size()));
        std::partial_sort(pool.begin(), pool.begin() + extra, pool.end(), std::greater<>());
        for (int h = 0; h < H; ++h) b.head[static_cast<size_t>(l) * H + h] = std::max(1, floor);
        for (int i = 0; i < extra; ++i) ++b.head[static_cast<size_t>(l) * H + pool[i].second];
      }
      break;
    }
    case Kind::kEkva:
    case Kind::kEkvaRandomGroups:
    case Kind::kEkvaNoGroup:
    case Kind::kEkvaOnline:
      if (options_.plan) {
        // The plan's relative shares over (layer, head), scaled to the requested mean budget.
        std::vector<double> w(static_cast<size_t>(L) * H);
        for (int l = 0; l < L; ++l) {
          for (int h = 0; h < H; ++h)
            w[static_cast<size_t>(l) * H + h] = options_.plan->retained_tokens(l, h, prompt_len);
        }
        b.head = apportion(base * L * H, w);
        for (int& x : b.head) x = std::max(1, x);
      }
      break;
    default:
      break;
  }
  if (grouped()) {
    const int G = num_groups_;
    b.group.resize(static_cast<size_t>(L) * H * G);
    const int window = std::min(options_.window, prompt_len);
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        std::vector<double> w(G, 1.0);
        if (options_.plan) {
          for (int g = 0; g < G; ++g) w[g] = options_.plan->group_tokens(l, h, g, prompt_len);
        }
        const int head = b.head[static_cast<size_t>(l) * H + h];
        const std::vector<int> q = apportion(std::max(0, head - window), w);
        std::copy(q.begin(), q.end(), b.group.begin() + (static_cast<ptrdiff_t>(l) * H + h) * G);
      }
    }
  }
  if (static_cast<int>(budgets_.size()) <= seq) budgets_.resize(seq + 1);
  budgets_[seq] = std::move(b);
}

// Slots of (seq, layer, kv_head) to keep: the protected ones plus the best-scored candidates.
std::vector<int> KvPolicy::select(const KvCache& cache, int seq, int layer, int kv_head,
                                  int prompt_len, int keep) const {
  const HeadTable& t = cache.table(seq, layer, kv_head);
  const int n = t.size();
  std::vector<int> kept, candidates;
  if (kind_ == Kind::kStreaming) {
    // Sinks, then the most recent tokens.
    const int sinks = std::min(options_.sinks, keep);
    for (int i = 0; i < n; ++i) {
      const int32_t p = t.meta[i].position;
      if (p < sinks || p >= prompt_len - (keep - sinks)) kept.push_back(i);
    }
    return kept;
  }
  const int window = std::min(options_.window, keep);
  for (int i = 0; i < n; ++i)
    (t.meta[i].position >= prompt_len - window ? kept : candidates).push_back(i);
  int remaining = keep - static_cast<int>(kept.size());
  auto by_score = [&](int a, int b) {
    return t.meta[a].score > t.meta[b].score ||
           (t.meta[a].score == t.meta[b].score && t.meta[a].position < t.meta[b].position);
  };
  std::sort(candidates.begin(), candidates.end(), by_score);
  if (!grouped()) {
    for (int i = 0; i < std::min<int>(remaining, static_cast<int>(candidates.size())); ++i)
      kept.push_back(candidates[i]);
    return kept;
  }
  // Each group keeps its best tokens up to its quota; quota a group cannot use goes to the best of
  // the rest.
  const int G = num_groups_;
  const int* quota =
      budgets_[seq].group.data() + (static_cast<size_t>(layer) * num_kv_heads_ + kv_head) * G;
  std::vector<int> used(G, 0);
  std::vector<int> rest;
  for (int c : candidates) {
    const int g = group_of(layer, t.meta[c]);
    if (used[g] < quota[g] && remaining > 0) {
      ++used[g];
      --remaining;
      kept.push_back(c);
    } else {
      rest.push_back(c);
    }
  }
  for (int i = 0; i < std::min<int>(remaining, static_cast<int>(rest.size())); ++i)
    kept.push_back(rest[i]);
  return kept;
}

void KvPolicy::compress(KvCache& cache, int seq, int prompt_len) {
  if (kind_ == Kind::kFull) return;
  const bool snap = kind_ != Kind::kStreaming && kind_ != Kind::kH2o;
  if (snap) {
    for (int l = 0; l < num_layers_; ++l) {
      for (int h = 0; h < num_kv_heads_; ++h)
        pool_scores(cache.table(seq, l, h), options_.pool_kernel);
    }
  }
  plan_budgets(cache, seq, prompt_len);
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      const HeadTable& t = cache.table(seq, l, h);
      const int keep = head_budget(seq, l, h);
      if (t.size() <= keep) continue;
      std::vector<uint8_t> evict_flag(t.size(), 1);
      for (int s : select(cache, seq, l, h, prompt_len, keep)) evict_flag[s] = 0;
      cache.evict_flagged(seq, l, h, evict_flag);
    }
  }
}

int KvPolicy::victim(const KvCache& cache, int seq, int layer, int kv_head) const {
  const HeadTable& t = cache.table(seq, layer, kv_head);
  const int n = t.size();
  if (kind_ == Kind::kStreaming) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (t.meta[i].position < options_.sinks) continue;
      if (best < 0 || t.meta[i].position < t.meta[best].position) best = i;
    }
    return best;
  }
  // The token just decoded is the sequence's newest; the window before it is protected.
  const int32_t newest = cache.next_position(seq) - 1;
  const int window = std::min(options_.window, head_budget(seq, layer, kv_head));
  const int32_t last_candidate = newest - window;
  if (!grouped()) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (t.meta[i].position > last_candidate) continue;
      if (best < 0 || t.meta[i].score < t.meta[best].score) best = i;
    }
    return best;
  }
  // One pass: candidates per group and each group's lowest score; evict from the group furthest
  // over its quota, or the lowest overall when none is over.
  const int G = num_groups_;
  const int* quota =
      budgets_[seq].group.data() + (static_cast<size_t>(layer) * num_kv_heads_ + kv_head) * G;
  std::vector<int> count(G, 0), lowest(G, -1);
  for (int i = 0; i < n; ++i) {
    if (t.meta[i].position > last_candidate) continue;
    const int g = group_of(layer, t.meta[i]);
    ++count[g];
    if (lowest[g] < 0 || t.meta[i].score < t.meta[lowest[g]].score) lowest[g] = i;
  }
  int group = -1, excess = 0, best = -1;
  for (int g = 0; g < G; ++g) {
    if (count[g] - quota[g] > excess) excess = count[g] - quota[g], group = g;
    if (lowest[g] >= 0 && (best < 0 || t.meta[lowest[g]].score < t.meta[best].score))
      best = lowest[g];
  }
  return group >= 0 ? lowest[group] : best;
}

void KvPolicy::refresh_group_budgets(const KvCache& cache, int seq) {
  const int G = num_groups_;
  SequenceBudgets& b = budgets_[seq];
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      std::vector<double> mass(G, 1e-6);  // a group that drew nothing keeps a share of zero tokens
      for (const TokenMeta& m : cache.table(seq, l, h).meta) mass[group_of(l, m)] += m.score;
      const int head = b.head[static_cast<size_t>(l) * num_kv_heads_ + h];
      const std::vector<int> q =
          apportion(std::max(0, head - std::min(options_.window, head)), mass);
      std::copy(q.begin(), q.end(),
                b.group.begin() + (static_cast<ptrdiff_t>(l) * num_kv_heads_ + h) * G);
    }
  }
}

void KvPolicy::evict(KvCache& cache, int seq) {
  if (kind_ == Kind::kFull) return;
  if (seq >= static_cast<int>(budgets_.size()) || budgets_[seq].head.empty()) {
    fail(ErrorKind::kInvalidArgument, "KV policy: sequence {} was never compressed", seq);
  }
  if (kind_ == Kind::kEkvaOnline && ++budgets_[seq].steps % options_.refresh == 0) {
    refresh_group_budgets(cache, seq);
  }
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      while (cache.table(seq, l, h).size() > head_budget(seq, l, h)) {
        const int v = victim(cache, seq, l, h);
        if (v < 0) break;  // everything left is protected
        cache.evict(seq, l, h, v);
      }
    }
  }
}

}  // namespace ekva
