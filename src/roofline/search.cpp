#include "roofline/search.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace ekva {
namespace {

// Largest b in [1, hi] with pred(b) true, for pred true up to some point and false after; 0 if
// pred(1) is false.
int64_t last_true(int64_t hi, const std::function<bool(int64_t)>& pred) {
  if (hi < 1 || !pred(1)) return 0;
  int64_t lo = 1;
  int64_t top = hi + 1;
  while (top - lo > 1) {
    const int64_t mid = lo + (top - lo) / 2;
    (pred(mid) ? lo : top) = mid;
  }
  return lo;
}

// Smallest b in [1, hi] with pred(b) true, for pred false up to some point and true after; 0 if
// pred(hi) is false.
int64_t first_true(int64_t hi, const std::function<bool(int64_t)>& pred) {
  if (hi < 1 || !pred(hi)) return 0;
  int64_t lo = 0;
  int64_t top = hi;
  while (top - lo > 1) {
    const int64_t mid = lo + (top - lo) / 2;
    (pred(mid) ? top : lo) = mid;
  }
  return top;
}

std::vector<double> default_fractions() {
  std::vector<double> f;
  for (int i = 0; i <= 16; ++i) f.push_back(std::pow(2.0, -0.5 * i));
  return f;
}

}  // namespace

std::string_view target_kind_name(TargetKind kind) {
  switch (kind) {
    case TargetKind::kMaxTimePerToken:
      return "max_time_per_token";
    case TargetKind::kMinThroughput:
      return "min_throughput";
    case TargetKind::kMemoryCap:
      return "memory_cap";
  }
  return "?";
}

SearchResult search_kv_budget(const ModelSpec& spec, const HardwareSpec& hw, const Workload& base,
                              const SearchTarget& target, const SearchOptions& options) {
  if (!(target.value > 0) || !std::isfinite(target.value)) {
    fail(ErrorKind::kInvalidArgument, "search target {} must be a positive number, got {}",
         target_kind_name(target.kind), target.value);
  }
  if (!(options.knee_threshold >= 0) || !std::isfinite(options.knee_threshold)) {
    fail(ErrorKind::kInvalidArgument, "knee threshold must be a finite number >= 0, got {}",
         options.knee_threshold);
  }
  if (options.batch_limit < 1) {
    fail(ErrorKind::kInvalidArgument, "batch limit must be positive, got {}", options.batch_limit);
  }
  if (base.context < 1) fail(ErrorKind::kInvalidArgument, "search needs a context of at least 1");
  std::vector<double> fractions =
      options.fractions.empty() ? default_fractions() : options.fractions;
  std::sort(fractions.begin(), fractions.end(), std::greater<>());
  fractions.erase(std::unique(fractions.begin(), fractions.end()), fractions.end());
  if (fractions.front() != 1.0) fractions.insert(fractions.begin(), 1.0);  // the reference

  MemoryOptions memory = options.memory;
  if (target.kind == TargetKind::kMemoryCap) memory.capacity_bytes = target.value;

  SearchResult result;
  result.target = target;
  for (double fraction : fractions) {
    Workload w = base;
    w.phase = Phase::kDecode;
    w.retained = KvRetention::fraction(spec, base.context, fraction);
    const auto time_at = [&](int64_t batch) {
      w.batch = batch;
      return predict_step(spec, hw, w, options.datasheet_only).time_s;
    };
    SearchPoint p;
    p.kv_fraction = fraction;
    p.kv_bytes_per_sequence = w.retained.bytes(spec, w.kv_format);
    p.memory_batch = max_batch(spec, hw, w, memory, options.batch_limit);
    const int64_t cap = std::min(p.memory_batch, options.batch_limit);
    int64_t batch = 0;
    switch (target.kind) {
      case TargetKind::kMaxTimePerToken:
        batch = last_true(cap, [&](int64_t b) { return time_at(b) <= target.value; });
        break;
      case TargetKind::kMinThroughput:
        batch = first_true(cap, [&](int64_t b) { return b / time_at(b) >= target.value; });
        break;
      case TargetKind::kMemoryCap:
        batch = cap;
        break;
    }
    p.feasible = batch > 0;
    p.batch = p.feasible ? batch : std::max<int64_t>(cap, 1);
    w.batch = p.batch;
    p.step = predict_step(spec, hw, w, options.datasheet_only);
    p.memory = memory_use(spec, hw, w, p.step, memory);
    p.time_s = p.step.time_s;
    p.tokens_per_s = p.batch / p.time_s;
    p.objective = target.kind == TargetKind::kMinThroughput ? 1.0 / p.time_s : p.tokens_per_s;
    if (!p.feasible) {
      p.limited_by = p.memory_batch == 0 ? "memory" : "target";
    } else if (p.batch == p.memory_batch) {
      p.limited_by = "memory";
    } else if (p.batch == options.batch_limit) {
      p.limited_by = "batch limit";
    } else {
      p.limited_by = "target";
    }
    result.points.push_back(std::move(p));
  }

  const SearchPoint& full = result.points.front();
  double best = 0;
  for (size_t i = 0; i < result.points.size(); ++i) {
    SearchPoint& p = result.points[i];
    if (full.feasible) p.gain_over_full = p.objective / full.objective;
    if (!p.feasible) continue;
    if (result.chosen < 0) result.chosen = static_cast<int>(i);
    best = std::max(best, p.objective);
  }
  int last_feasible = -1;
  for (size_t i = 0; i < result.points.size(); ++i) {
    if (result.points[i].feasible) last_feasible = static_cast<int>(i);
  }
  for (size_t i = 0; i < result.points.size() && best > 0; ++i) {
    const SearchPoint& p = result.points[i];
    if (p.feasible && best <= p.objective * (1 + options.knee_threshold)) {
      result.knee = static_cast<int>(i);
      break;
    }
  }
  // A knee needs a smaller budget that shows the gains have stopped; at the grid's end they may
  // not have.
  if (result.knee == last_feasible) result.knee = -1;
  if (result.knee >= 0) {
    const StepCost& s = result.points[result.knee].step;
    const std::pair<double, const char*> shares[] = {{s.weight_time_s, "weights"},
                                                     {s.kv_time_s, "kv"},
                                                     {s.activation_time_s, "activations"},
                                                     {s.compute_time_s, "compute"},
                                                     {s.latency_time_s, "latency"}};
    result.knee_dominated_by = std::max_element(std::begin(shares), std::end(shares))->second;
  }
  return result;
}

}  // namespace ekva
