#include "budget/allocator.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <queue>

#include "core/error.h"

namespace ekva {
namespace {

constexpr const char* kAllocators[] = {"uniform", "pyramid", "proportional", "greedy"};
constexpr const char* kScopes[] = {"layer", "head", "expert", "joint"};

// One (layer, KV head, group) and what calibration predicts for it.
struct Cell {
  int layer, head, group;
  std::vector<int> experts;
  std::vector<double> share;  // each expert's share of the group's keys
  double importance = 0.0;    // mean attention entropy x log(routing count)
};

double interpolate(const std::vector<double>& grid, const CalibrationStats& s, int l, int h, int e,
                   double x) {
  x = std::clamp(x, 0.0, 1.0);
  double x0 = 0.0, y0 = 0.0;
  for (size_t g = 0; g < grid.size(); ++g) {
    const double y1 = s.retention(l, h, e, g);
    if (x <= grid[g]) return y0 + (y1 - y0) * (x - x0) / (grid[g] - x0);
    x0 = grid[g];
    y0 = y1;
  }
  return y0;
}

// Attention mass a cell keeps with a budget of x (a fraction of the context), its experts splitting
// x by their key shares.
double cell_value(const CalibrationStats& s, const Cell& c, double x) {
  double v = 0.0;
  for (size_t i = 0; i < c.experts.size(); ++i) {
    if (c.share[i] > 0) v += interpolate(s.grid, s, c.layer, c.head, c.experts[i], x * c.share[i]);
  }
  return v;
}

}  // namespace

Allocator parse_allocator(const std::string& name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kAllocators[i]) return static_cast<Allocator>(i);
  }
  fail(ErrorKind::kInvalidArgument,
       "unknown allocator '{}' (known: uniform, pyramid, proportional, greedy)", name);
}

PlanScope parse_scope(const std::string& name) {
  for (int i = 0; i < 4; ++i) {
    if (name == kScopes[i]) return static_cast<PlanScope>(i);
  }
  fail(ErrorKind::kInvalidArgument, "unknown scope '{}' (known: layer, head, expert, joint)", name);
}

const char* allocator_name(Allocator a) {
  return kAllocators[static_cast<int>(a)];
}
const char* scope_name(PlanScope s) {
  return kScopes[static_cast<int>(s)];
}

std::vector<int> coroute_groups(const CalibrationStats& stats, int layer, int groups) {
  const int E = stats.num_experts;
  if (groups <= 0 || groups > E)
    fail(ErrorKind::kInvalidArgument, "{} groups for {} experts", groups, E);
  std::vector<std::vector<int>> members(E);
  for (int e = 0; e < E; ++e) members[e] = {e};
  auto mass = [&](const std::vector<int>& m) {
    double x = 0;
    for (int e : m) x += stats.routing_topk[stats.le(layer, e)];
    return x;
  };
  auto affinity = [&](const std::vector<int>& a, const std::vector<int>& b) {
    double x = 0;
    for (int i : a)
      for (int j : b) x += stats.coroute[(static_cast<size_t>(layer) * E + i) * E + j];
    return x;
  };
  while (static_cast<int>(members.size()) > groups) {
    size_t smallest = 0;
    for (size_t i = 1; i < members.size(); ++i) {
      if (mass(members[i]) < mass(members[smallest])) smallest = i;
    }
    size_t partner = smallest == 0 ? 1 : 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (i == smallest) continue;
      const double a = affinity(members[smallest], members[i]),
                   best = affinity(members[smallest], members[partner]);
      if (a > best || (a == best && mass(members[i]) < mass(members[partner]))) partner = i;
    }
    members[partner].insert(members[partner].end(), members[smallest].begin(),
                            members[smallest].end());
    members.erase(members.begin() + static_cast<ptrdiff_t>(smallest));
  }
  std::vector<int> group(E);
  for (size_t g = 0; g < members.size(); ++g)
    for (int e : members[g]) group[e] = static_cast<int>(g);
  return group;
}

BudgetPlan make_plan(const CalibrationStats& s, const PlanOptions& o) {
  const int L = s.num_layers, H = s.num_kv_heads, E = s.num_experts;
  const int G = o.groups == 0 ? E : o.groups;
  if (!(o.budget > 0) || !std::isfinite(o.budget))
    fail(ErrorKind::kInvalidArgument, "plan budget {} must be > 0", o.budget);
  if (o.floor < 0) fail(ErrorKind::kInvalidArgument, "plan floor {} must be >= 0", o.floor);
  const bool fraction = o.budget <= 1.0;
  // Curves are in fractions of the context; token budgets are read against the calibration chunk
  // length.
  const double unit = fraction ? 1.0 : static_cast<double>(s.chunk_tokens);
  const double X = o.budget / unit, floor = o.floor / unit;
  if (floor * G > X + 1e-12) {
    fail(ErrorKind::kInvalidArgument,
         "budget cannot be met: a floor of {} for each of {} groups exceeds the budget {}", o.floor,
         G, o.budget);
  }
  ModelSpec shape;
  shape.model_type = s.model_type;
  shape.num_layers = L;
  shape.num_kv_heads = H;
  shape.num_experts = E;
  BudgetPlan plan(shape, G, fraction ? BudgetPlan::Unit::kFraction : BudgetPlan::Unit::kTokens);

  std::vector<Cell> cells;
  for (int l = 0; l < L; ++l) {
    const std::vector<int> group = G == E ? [&] { std::vector<int> id(E); std::iota(id.begin(), id.end(), 0); return id; }()
                                          : coroute_groups(s, l, G);
    for (int e = 0; e < E; ++e) plan.set_expert_group(l, e, group[e]);
    for (int h = 0; h < H; ++h) {
      for (int g = 0; g < G; ++g) {
        Cell c{l, h, g, {}, {}, 0.0};
        double share = 0, entropy = 0, entropy_n = 0, count = 0;
        for (int e = 0; e < E; ++e) {
          if (group[e] != g) continue;
          c.experts.push_back(e);
          share += s.key_share(l, h, e);
          entropy += s.entropy_sum[s.lhe(l, h, e)];
          entropy_n += s.entropy_count[s.lhe(l, h, e)];
          count += s.routing_primary[s.le(l, e)];
        }
        for (int e : c.experts) c.share.push_back(share > 0 ? s.key_share(l, h, e) / share : 0.0);
        c.importance = (entropy_n > 0 ? entropy / entropy_n : 0.0) * std::log1p(count);
        cells.push_back(std::move(c));
      }
    }
  }
  auto cell_index = [&](int l, int h, int g) { return (static_cast<size_t>(l) * H + h) * G + g; };
  std::vector<double> x(cells.size(), X / G);  // per-cell budget, fractions of the context

  // Units share one budget split evenly over their cells; pools hold a fixed total.
  auto unit_of = [&](const Cell& c) -> long {
    switch (o.scope) {
      case PlanScope::kLayer:
        return c.layer;
      case PlanScope::kHead:
        return static_cast<long>(c.layer) * H + c.head;
      default:
        return static_cast<long>(cell_index(c.layer, c.head, c.group));
    }
  };
  auto pool_of = [&](const Cell& c) -> long {
    return o.scope == PlanScope::kExpert ? static_cast<long>(c.layer) * H + c.head : 0L;
  };

  if (o.allocator == Allocator::kPyramid) {
    for (Cell& c : cells) {
      const double w = L == 1 ? 1.0 : 1.5 - static_cast<double>(c.layer) / (L - 1);
      x[cell_index(c.layer, c.head, c.group)] = std::max(floor, X * w / G);
    }
  } else if (o.allocator != Allocator::kUniform) {
    std::map<long, std::map<long, std::vector<size_t>>> pools;  // pool -> unit -> cells
    for (size_t i = 0; i < cells.size(); ++i)
      pools[pool_of(cells[i])][unit_of(cells[i])].push_back(i);
    for (auto& [pool_id, units] : pools) {
      size_t pool_cells = 0;
      for (auto& [u, members] : units) pool_cells += members.size();
      const double total = X * static_cast<double>(pool_cells) / G;  // X per head, G cells per head
      double remaining = total - floor * static_cast<double>(pool_cells);
      for (auto& [u, members] : units)
        for (size_t i : members) x[i] = floor;
      if (o.allocator == Allocator::kProportional) {
        double sum = 0;
        for (auto& [u, members] : units)
          for (size_t i : members) sum += cells[i].importance;
        for (auto& [u, members] : units) {
          double w = 0;
          for (size_t i : members) w += cells[i].importance;
          const double share = sum > 0 ? w / sum : 1.0 / units.size();
          for (size_t i : members) x[i] += remaining * share / members.size();
        }
      } else {  // greedy: repeatedly raise the unit whose next step buys the most mass per budget
        const double step = X / G / 32;
        using Entry = std::pair<double, long>;
        std::priority_queue<Entry> heap;
        auto gain = [&](long u) {
          double g = 0;
          for (size_t i : units[u])
            g += cell_value(s, cells[i], x[i] + step) - cell_value(s, cells[i], x[i]);
          return g / (step * units[u].size());
        };
        for (auto& [u, members] : units) heap.emplace(gain(u), u);
        while (remaining > 1e-12 && !heap.empty()) {
          const long u = heap.top().second;
          heap.pop();
          const double cost = step * units[u].size();
          const double take = std::min(cost, remaining);
          for (size_t i : units[u]) x[i] += take / units[u].size();
          remaining -= take;
          heap.emplace(gain(u), u);
        }
      }
    }
  }
  double predicted = 0.0;
  for (size_t i = 0; i < cells.size(); ++i) {
    plan.set_budget(cells[i].layer, cells[i].head, cells[i].group,
                    std::min(x[i] * unit, fraction ? 1.0 : x[i] * unit));
    predicted += cell_value(s, cells[i], x[i]);
  }
  plan.provenance = {{"allocator", allocator_name(o.allocator)},
                     {"scope", scope_name(o.scope)},
                     {"budget", o.budget},
                     {"floor", o.floor},
                     {"groups", G},
                     {"calibration",
                      {{"tokens", s.tokens},
                       {"chunks", s.chunks},
                       {"chunk_tokens", s.chunk_tokens},
                       {"base_loss", s.base_loss}}},
                     {"predicted_retained_mass", predicted / (static_cast<double>(L) * H)}};
  return plan;
}

}  // namespace ekva
