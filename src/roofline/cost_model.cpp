#include "roofline/cost_model.h"

#include <algorithm>
#include <cmath>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_budget.h"

namespace ekva {
namespace {

// FLOPs per element of the elementwise steps, counted as a kernel executes them.
constexpr double kRmsNormFlops = 4;  // square, accumulate, scale by 1/rms, scale by the weight
constexpr double kRopeFlops = 3;     // 2 multiplies and 1 add per rotated element
constexpr double kSoftmaxFlops = 5;  // scale, running max, subtract and exp, sum, normalise
constexpr double kSwigluFlops = 5;   // silu (negate, exp, add, divide) and the gate product
constexpr double kLogitBytes = 4;    // logits are produced in float32

Bound row_bound(const OperatorCost& op) {
  const double roof = std::max(op.compute_time_s, op.memory_time_s);
  if (op.latency_s > roof) return Bound::kLatency;
  return op.compute_time_s > op.memory_time_s ? Bound::kCompute : Bound::kMemory;
}

class StepBuilder {
 public:
  StepBuilder(const ModelSpec& spec, const HardwareSpec& hw, const Workload& w, bool datasheet_only)
      : s_(spec),
        hw_(hw),
        w_(w),
        ceilings_(hw.ceilings(datasheet_only)),
        datasheet_only_(datasheet_only),
        act_(number_format_bytes(w.activation_format)),
        weight_(number_format_bytes(w.weight_format)),
        kv_(number_format_bytes(w.kv_format)),
        batch_(static_cast<double>(w.batch)),
        tokens_(w.phase == Phase::kDecode ? batch_ : batch_ * static_cast<double>(w.context)),
        experts_grouped_(
            s_.num_experts == 0 ||
            routed_experts_grouped(static_cast<int64_t>(tokens_), s_.top_k, s_.num_experts)) {}

  StepCost build() {
    std::vector<double> experts_touched(s_.num_layers, 0.0);
    const double h = s_.hidden_size;
    {
      auto& op = add(OperatorKind::kEmbedding, -1);
      op.weight_bytes = tokens_ * h * weight_;  // one table row per token
      op.activation_write_bytes = tokens_ * h * act_;
    }
    for (int l = 0; l < s_.num_layers; ++l) {
      attention_block(l);
      if (s_.layer_is_moe[l]) {
        experts_touched[l] = w_.routing.experts_touched(s_, l, tokens_);
        moe_block(l, experts_touched[l]);
      } else {
        rms_norm(OperatorKind::kMlpNorm, l, tokens_);
        swiglu(OperatorKind::kDenseMlp, l, tokens_, s_.dense_intermediate, false);
      }
    }
    // Logits are needed for the last position of each sequence only.
    rms_norm(OperatorKind::kFinalNorm, -1, batch_);
    {
      auto& op = add(OperatorKind::kLmHead, -1);
      op.flops = 2 * batch_ * h * s_.vocab_size;
      op.weight_bytes = h * s_.vocab_size * weight_;
      op.activation_read_bytes = batch_ * h * act_;
      op.activation_write_bytes = batch_ * s_.vocab_size * kLogitBytes;
    }
    for (auto& op : rows_) finish(op);
    StepCost totals = sum_rows(rows_);
    totals.operators = std::move(rows_);
    totals.tokens = tokens_;
    totals.experts_touched = std::move(experts_touched);
    return totals;
  }

 private:
  OperatorCost& add(OperatorKind kind, int layer) {
    OperatorCost op;
    op.kind = kind;
    op.layer = layer;
    rows_.push_back(op);
    return rows_.back();
  }

  void rms_norm(OperatorKind kind, int layer, double rows) {
    auto& op = add(kind, layer);
    const double h = s_.hidden_size;
    op.flops = kRmsNormFlops * rows * h;
    op.weight_bytes = h * weight_;
    op.activation_read_bytes = rows * h * act_;
    op.activation_write_bytes = rows * h * act_;
  }

  void attention_block(int l) {
    const double t = tokens_;
    const double h = s_.hidden_size;
    const double d = s_.head_dim;
    const double q_dim = s_.q_dim();
    const double kv_dim = s_.kv_dim();
    const double group = static_cast<double>(s_.num_heads) / s_.num_kv_heads;
    rms_norm(OperatorKind::kAttnNorm, l, t);
    {
      auto& op = add(OperatorKind::kQkvProj, l);
      const double n = q_dim + 2 * kv_dim;
      op.flops = 2 * t * h * n + (s_.qkv_bias ? t * n : 0);
      op.weight_bytes = (h * n + (s_.qkv_bias ? n : 0)) * weight_;
      op.activation_read_bytes = t * h * act_;
      op.activation_write_bytes = t * n * act_;
    }
    if (s_.qk_norm != QkNorm::kNone) {
      auto& op = add(OperatorKind::kQkNorm, l);
      const double elements = t * (q_dim + kv_dim);
      op.flops = kRmsNormFlops * elements;
      op.weight_bytes = (s_.qk_norm == QkNorm::kPerHead ? 2 * d : q_dim + kv_dim) * weight_;
      op.activation_read_bytes = elements * act_;
      op.activation_write_bytes = elements * act_;
    }
    {
      auto& op = add(OperatorKind::kRopeKvWrite, l);
      op.flops = kRopeFlops * t * (q_dim + kv_dim);
      op.activation_read_bytes = t * (q_dim + 2 * kv_dim) * act_;
      op.activation_write_bytes = t * q_dim * act_;
      // Decode appends one token per sequence; prefill stores what prompt-time compression keeps.
      const double stored =
          w_.phase == Phase::kDecode ? batch_ * s_.num_kv_heads : batch_ * retained_in_layer(l);
      op.kv_write_bytes = stored * 2 * d * kv_;
    }
    add(OperatorKind::kAttentionScores, l);
    add(OperatorKind::kAttentionValues, l);
    auto& sc = rows_[rows_.size() - 2];
    auto& values = rows_.back();
    if (w_.phase == Phase::kDecode) {
      // A fused kernel reads each (sequence, KV head)'s keys and values once for the whole query
      // group (GQA), keeps the scores on chip and writes only the output.
      const double kv_tokens = batch_ * (retained_in_layer(l) + s_.num_kv_heads);
      const double query_pairs = kv_tokens * group;  // (query head, key) pairs
      sc.flops = query_pairs * (2 * d + kSoftmaxFlops);
      sc.activation_read_bytes = t * q_dim * act_;
      sc.kv_read_bytes = kv_tokens * d * kv_;
      values.flops = query_pairs * 2 * d;
      values.kv_read_bytes = kv_tokens * d * kv_;
      values.activation_write_bytes = t * q_dim * act_;
    } else {
      // Causal prefill over the whole prompt (compression happens after attention), with an
      // IO-aware kernel that reads q, k and v once.
      const double len = static_cast<double>(w_.context);
      const double query_pairs = batch_ * s_.num_heads * len * (len + 1) / 2;
      sc.flops = query_pairs * (2 * d + kSoftmaxFlops);
      sc.activation_read_bytes = t * (q_dim + kv_dim) * act_;
      values.flops = query_pairs * 2 * d;
      values.activation_read_bytes = t * kv_dim * act_;
      values.activation_write_bytes = t * q_dim * act_;
    }
    {
      auto& op = add(OperatorKind::kOutProj, l);
      op.flops = 2 * t * q_dim * h + t * h;  // with the residual add
      op.weight_bytes = (q_dim * h + (s_.o_bias ? h : 0)) * weight_;
      op.activation_read_bytes = t * (q_dim + h) * act_;
      op.activation_write_bytes = t * h * act_;
    }
  }

  // A SwiGLU MLP over `rows` tokens: gate and up (one fused GEMM), the activation, down.
  void swiglu(OperatorKind kind, int layer, double rows, double inter, bool gated_output) {
    auto& op = add(kind, layer);
    const double h = s_.hidden_size;
    op.flops = rows * (2 * 3 * h * inter + kSwigluFlops * inter) +
               (gated_output ? rows * (2 * h + 2 * h) : 0);
    op.weight_bytes = (3 * h * inter + (gated_output ? h : 0)) * weight_;
    op.activation_read_bytes = rows * (h + 2 * inter + inter) * act_;
    op.activation_write_bytes = rows * (2 * inter + inter + h) * act_;
  }

  void moe_block(int l, double touched) {
    const double t = tokens_;
    const double h = s_.hidden_size;
    const double e = s_.num_experts;
    const double inter = s_.expert_intermediate;
    rms_norm(OperatorKind::kMlpNorm, l, t);
    {
      auto& op = add(OperatorKind::kRouter, l);
      op.flops = 2 * t * h * e + kSoftmaxFlops * t * e;
      op.weight_bytes = h * e * weight_;
      op.activation_read_bytes = t * h * act_;
      op.activation_write_bytes = t * e * act_;
    }
    {
      auto& op = add(OperatorKind::kRoutedExperts, l);
      const double assignments = t * s_.top_k;
      // Weights of every touched expert are read once per step (grouped GEMM); each assignment
      // gathers its input row, and the gate-weighted outputs are summed per token.
      op.flops = assignments * (2 * 3 * h * inter + kSwigluFlops * inter + 2 * h);
      op.weight_bytes = touched * 3 * h * inter * weight_;
      op.activation_read_bytes = assignments * (h + 3 * inter + h) * act_;
      op.activation_write_bytes = (assignments * (3 * inter + h) + t * h) * act_;
    }
    if (s_.shared_intermediate > 0) {
      swiglu(OperatorKind::kSharedExpert, l, t, s_.shared_intermediate, s_.shared_expert_gated);
    }
  }

  double retained_in_layer(int l) const {
    double sum = 0;
    for (int k = 0; k < s_.num_kv_heads; ++k) sum += w_.retained.at(s_, l, k);
    return sum;
  }

  void finish(OperatorCost& op) const {
    PeakFormat format = PeakFormat::kFP32;
    switch (operator_class(op.kind)) {
      case OperatorClass::kGemm:
        format = gemm_peak_format(w_.weight_format);
        break;
      case OperatorClass::kAttention:
        format = gemm_peak_format(w_.activation_format);
        break;
      case OperatorClass::kElementwise:
        format = PeakFormat::kFP32;  // CUDA cores / vector units, not tensor cores
        break;
    }
    op.peak_format = ceilings_.effective_format(format);
    op.latency_s = hw_.latency(op.kind, datasheet_only_);
    if (op.kind == OperatorKind::kRoutedExperts && !experts_grouped_) {
      expert_gemms(op, ceilings_.peak(format));
      return;
    }
    op.efficiency = hw_.efficiency(op.kind, w_.phase, datasheet_only_);
    op.compute_time_s = op.flops / (ceilings_.peak(format) * op.efficiency);
    op.memory_time_s = (op.read_bytes() / ceilings_.read_bandwidth +
                        op.write_bytes() / ceilings_.write_bandwidth) /
                       op.efficiency;
    op.time_s = std::max(op.compute_time_s, op.memory_time_s) + op.latency_s;
    op.bound = row_bound(op);
  }

  // Routed experts run as one GEMM per expert (a coarse model's prompt, routed_experts_grouped):
  // the GEMMs, at the GEMMs' efficiency, read the weights; the gathers of the assignments' rows,
  // the SwiGLU and the gated sums are passes of their own over the activations, at the
  // elementwise operators' efficiency, after them.
  void expert_gemms(OperatorCost& op, double peak) const {
    op.efficiency = hw_.efficiency_as(OperatorClass::kGemm, w_.phase, datasheet_only_);
    const double passes = hw_.efficiency_as(OperatorClass::kElementwise, w_.phase, datasheet_only_);
    op.compute_time_s = op.flops / (peak * op.efficiency);
    const double weights_s = op.weight_bytes / ceilings_.read_bandwidth / op.efficiency;
    const double passes_s = ((op.read_bytes() - op.weight_bytes) / ceilings_.read_bandwidth +
                             op.write_bytes() / ceilings_.write_bandwidth) /
                            passes;
    op.memory_time_s = weights_s + passes_s;
    op.time_s = std::max(op.compute_time_s, weights_s) + passes_s + op.latency_s;
    op.bound = row_bound(op);
  }

  const ModelSpec& s_;
  const HardwareSpec& hw_;
  const Workload& w_;
  Ceilings ceilings_;
  bool datasheet_only_;
  double act_, weight_, kv_;
  double batch_, tokens_;
  bool experts_grouped_;  // routed_experts_grouped: the engine's kernels for the routed experts
  std::vector<OperatorCost> rows_;
};

void check_workload(const ModelSpec& spec, const Workload& w) {
  if (w.batch <= 0) fail(ErrorKind::kInvalidArgument, "batch must be positive, got {}", w.batch);
  if (w.context < 0 || (w.phase == Phase::kPrefill && w.context == 0)) {
    fail(ErrorKind::kInvalidArgument, "context {} is not valid for {}", w.context,
         phase_name(w.phase));
  }
  const size_t cells = static_cast<size_t>(spec.num_layers) * spec.num_kv_heads;
  if (w.retained.tokens.size() != cells) {
    fail(ErrorKind::kInvalidArgument,
         "retained KV covers {} (layer, KV head) cells; the model has {} layers x {} KV heads",
         w.retained.tokens.size(), spec.num_layers, spec.num_kv_heads);
  }
  for (size_t i = 0; i < cells; ++i) {
    const double r = w.retained.tokens[i];
    if (!(r >= 0) || r > static_cast<double>(w.context) + 1e-9) {
      fail(ErrorKind::kInvalidArgument,
           "layer {} KV head {} retains {} tokens; must be in [0, context {}]",
           i / spec.num_kv_heads, i % spec.num_kv_heads, r, w.context);
    }
  }
  if (spec.layer_is_moe.size() != static_cast<size_t>(spec.num_layers)) {
    fail(ErrorKind::kInvalidArgument, "model spec lists {} layer kinds for {} layers",
         spec.layer_is_moe.size(), spec.num_layers);
  }
}

}  // namespace

std::string_view bound_name(Bound bound) {
  switch (bound) {
    case Bound::kMemory:
      return "memory";
    case Bound::kCompute:
      return "compute";
    case Bound::kLatency:
      return "latency";
  }
  return "?";
}

KvRetention KvRetention::full(const ModelSpec& spec, int64_t context) {
  return fraction(spec, context, 1.0);
}

KvRetention KvRetention::fraction(const ModelSpec& spec, int64_t context, double fraction) {
  if (!(fraction > 0) || fraction > 1) {
    fail(ErrorKind::kInvalidArgument, "KV fraction {} must be in (0, 1]", fraction);
  }
  const double c = static_cast<double>(context);
  KvRetention r;
  r.tokens.assign(static_cast<size_t>(spec.num_layers) * spec.num_kv_heads,
                  std::min(c, std::max(1.0, std::round(c * fraction))));
  return r;
}

KvRetention KvRetention::from_plan(const ModelSpec& spec, const BudgetPlan& plan, int64_t context,
                                   std::optional<double> budget) {
  const KvBudgets b = resolve_budgets(spec, &plan, budget, context);
  const double c = static_cast<double>(context);
  KvRetention r;
  r.tokens.reserve(b.head.size());
  for (int tokens : b.head)
    r.tokens.push_back(std::min(c, static_cast<double>(tokens + b.sinks + b.recent)));
  return r;
}

double KvRetention::total() const {
  double sum = 0;
  for (double t : tokens) sum += t;
  return sum;
}

double KvRetention::bytes(const ModelSpec& spec, NumberFormat kv_format) const {
  return total() * 2 * spec.head_dim * number_format_bytes(kv_format);
}

double StepCost::mean_experts_touched() const {
  double sum = 0;
  int layers = 0;
  for (double e : experts_touched) {
    if (e > 0) {
      sum += e;
      ++layers;
    }
  }
  return layers > 0 ? sum / layers : 0.0;
}

StepCost predict_step(const ModelSpec& spec, const HardwareSpec& hw, const Workload& workload,
                      bool datasheet_only) {
  if (workload.retained.tokens.empty()) {
    Workload full = workload;
    full.retained = KvRetention::full(spec, workload.context);
    return predict_step(spec, hw, full, datasheet_only);
  }
  check_workload(spec, workload);
  return StepBuilder(spec, hw, workload, datasheet_only).build();
}

std::vector<OperatorCost> aggregate_by_operator(const std::vector<OperatorCost>& rows) {
  std::vector<OperatorCost> out;
  for (const auto& r : rows) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const OperatorCost& o) { return o.kind == r.kind; });
    if (it == out.end()) {
      out.push_back(r);
      out.back().layer = -1;
      continue;
    }
    it->count += r.count;
    it->flops += r.flops;
    it->weight_bytes += r.weight_bytes;
    it->activation_read_bytes += r.activation_read_bytes;
    it->activation_write_bytes += r.activation_write_bytes;
    it->kv_read_bytes += r.kv_read_bytes;
    it->kv_write_bytes += r.kv_write_bytes;
    it->compute_time_s += r.compute_time_s;
    it->memory_time_s += r.memory_time_s;
    it->latency_s += r.latency_s;
    it->time_s += r.time_s;
  }
  for (auto& o : out) o.bound = row_bound(o);
  return out;
}

StepCost sum_rows(const std::vector<OperatorCost>& rows) {
  StepCost t;
  double time_by_bound[3] = {0, 0, 0};  // indexed by Bound
  for (const auto& r : rows) {
    t.flops += r.flops;
    t.weight_bytes += r.weight_bytes;
    t.activation_bytes += r.activation_read_bytes + r.activation_write_bytes;
    t.kv_read_bytes += r.kv_read_bytes;
    t.kv_write_bytes += r.kv_write_bytes;
    t.bytes += r.bytes();
    t.time_s += r.time_s;
    time_by_bound[static_cast<int>(r.bound)] += r.time_s;
    t.latency_time_s += r.latency_s;
    const double roof = r.time_s - r.latency_s;
    if (r.compute_time_s > r.memory_time_s) {
      t.compute_time_s += roof;
    } else if (const double b = r.bytes(); b > 0) {
      t.weight_time_s += roof * r.weight_bytes / b;
      t.kv_time_s += roof * (r.kv_read_bytes + r.kv_write_bytes) / b;
      t.activation_time_s += roof * (r.activation_read_bytes + r.activation_write_bytes) / b;
    }
  }
  t.bound = static_cast<Bound>(std::max_element(time_by_bound, time_by_bound + 3) - time_by_bound);
  return t;
}

}  // namespace ekva
