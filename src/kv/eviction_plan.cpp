#include "kv/eviction_plan.h"

#include <algorithm>
#include <exception>
#include <numeric>

#include "core/error.h"

namespace ekva {

std::vector<uint8_t> select_evictions(const HeadTable& t, const SegmentEviction& s) {
  const int n = t.size();
  std::vector<uint8_t> evict(n, 1);
  std::vector<int> candidates;
  int remaining = s.keep;
  for (int i = 0; i < n; ++i) {
    const int32_t p = t.meta[i].position;
    if (p < s.sinks || p >= s.recent_from ||
        std::binary_search(s.pinned.begin(), s.pinned.end(), p)) {
      evict[i] = 0;
      --remaining;
    } else {
      candidates.push_back(i);
    }
  }
  if (remaining <= 0) return evict;
  const auto better = [&](int a, int b) {
    return t.meta[a].score > t.meta[b].score ||
           (t.meta[a].score == t.meta[b].score && t.meta[a].position < t.meta[b].position);
  };
  if (s.quota.empty()) {
    // Positions are distinct, so the best `remaining` form one set whatever their order: a
    // selection, not a sort.
    if (remaining < static_cast<int>(candidates.size()))
      std::nth_element(candidates.begin(), candidates.begin() + remaining, candidates.end(),
                       better);
  } else {
    std::sort(candidates.begin(), candidates.end(), better);
    if (static_cast<int>(s.slot_group.size()) != n) {
      fail(ErrorKind::kInvalidArgument, "eviction plan: {} group labels for {} slots",
           s.slot_group.size(), n);
    }
    std::vector<int> used(s.quota.size(), 0);
    std::vector<int> rest;
    for (int c : candidates) {
      const int g = s.slot_group[c];
      if (used[g] < s.quota[g] && remaining > 0) {
        ++used[g];
        --remaining;
        evict[c] = 0;
      } else {
        rest.push_back(c);
      }
    }
    candidates = std::move(rest);
  }
  for (int i = 0; i < std::min<int>(remaining, static_cast<int>(candidates.size())); ++i)
    evict[candidates[i]] = 0;
  return evict;
}

std::vector<std::vector<uint8_t>> select_plan_evictions(const EvictionPlan& plan,
                                                        KvLayout& layout) {
  // Each table is pooled and selected on its own, so the tables run on all threads when they hold
  // many slots (a prompt's compression), one after another otherwise (a decode step's).
  const int L = layout.num_layers(), H = layout.num_kv_heads();
  [[maybe_unused]] const bool parallel =
      static_cast<int64_t>(layout.retained_tokens(plan.seq)) >= kParallelSlots;
  if (plan.pool_kernel > 1) {
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int t = 0; t < L * H; ++t)
      pool_scores(layout.table(plan.seq, t / H, t % H), plan.pool_kernel);
  }
  const int count = static_cast<int>(plan.segments.size());
  std::vector<std::vector<uint8_t>> flags(plan.segments.size());
  std::vector<std::exception_ptr> failures(plan.segments.size());  // none may leave the region
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int i = 0; i < count; ++i) {
    const SegmentEviction& segment = plan.segments[i];
    try {
      flags[i] = select_evictions(layout.table(plan.seq, segment.layer, segment.kv_head), segment);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  return flags;
}

void apply_on_host(const EvictionPlan& plan, KvLayout& layout, KvPages& pages) {
  const std::vector<std::vector<uint8_t>> flags = select_plan_evictions(plan, layout);
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const SegmentEviction& segment = plan.segments[i];
    pages.move_rows(layout.evict_flagged(plan.seq, segment.layer, segment.kv_head, flags[i]));
  }
}

void pool_scores(HeadTable& table, int kernel) {
  const int n = table.size();
  if (kernel <= 1 || n == 0) return;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  const auto earlier = [&](int a, int b) {
    return table.meta[a].position < table.meta[b].position;
  };
  // Right after a prefill the slots are already in position order.
  if (!std::is_sorted(order.begin(), order.end(), earlier))
    std::sort(order.begin(), order.end(), earlier);
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

}  // namespace ekva
