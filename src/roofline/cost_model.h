#pragma once
// Per-operator FLOPs, bytes and roofline time of one prefill or decode step of an MoE decoder
// (formulas in docs/ROOFLINE.md). The KV side takes the retained tokens of every (layer, KV head),
// so full KV, a uniform fraction and a BudgetPlan are all the same input.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "arch/model_spec.h"
#include "kv/budget_plan.h"
#include "roofline/hardware.h"
#include "roofline/number_format.h"
#include "roofline/operators.h"
#include "roofline/routing.h"

namespace ekva {

// Retained KV tokens of one sequence, per (layer, KV head), row-major [layer][kv_head].
struct KvRetention {
  std::vector<double> tokens;

  static KvRetention full(const ModelSpec& spec, int64_t context);
  // The same fraction of `context` everywhere (at least one token).
  static KvRetention fraction(const ModelSpec& spec, int64_t context, double fraction);
  // What `plan` keeps at a prompt of `context` tokens, rescaled to `budget` when one is given
  // (resolve_budgets, the policies' meaning): per (layer, KV head) its budget plus the sink and
  // recent tokens, at most the context. Checks the plan's model.
  static KvRetention from_plan(const ModelSpec& spec, const BudgetPlan& plan, int64_t context,
                               std::optional<double> budget = std::nullopt);
  double at(const ModelSpec& spec, int layer, int kv_head) const {
    return tokens[static_cast<size_t>(layer) * spec.num_kv_heads + kv_head];
  }
  double total() const;
  // Bytes of K and V one sequence keeps.
  double bytes(const ModelSpec& spec, NumberFormat kv_format) const;
};

struct Workload {
  Phase phase = Phase::kDecode;
  int64_t batch = 1;
  // Decode: tokens already in each sequence's context; prefill: the prompt length.
  int64_t context = 0;
  NumberFormat weight_format = NumberFormat::kBF16;
  NumberFormat activation_format = NumberFormat::kBF16;
  NumberFormat kv_format = NumberFormat::kBF16;
  // What each sequence keeps of its `context` tokens (decode: what attention reads; prefill: what
  // is written to the cache after prompt-time compression). Empty: full KV.
  KvRetention retained;
  RoutingModel routing;
};

// What sets an operator's time: bytes, FLOPs, or its fixed per-call latency.
enum class Bound { kMemory, kCompute, kLatency };
std::string_view bound_name(Bound bound);

struct OperatorCost {
  OperatorKind kind = OperatorKind::kEmbedding;
  int layer = -1;  // -1: outside the decoder layers (embedding, final norm, LM head)
  int count = 1;   // rows summed into this one (aggregate_by_operator)
  double flops = 0;
  double weight_bytes = 0;
  double activation_read_bytes = 0;
  double activation_write_bytes = 0;
  double kv_read_bytes = 0;
  double kv_write_bytes = 0;
  PeakFormat peak_format = PeakFormat::kBF16;  // the peak the FLOPs are held to
  double efficiency = 1;
  double compute_time_s = 0;
  double memory_time_s = 0;
  double latency_s = 0;  // the measured fixed cost per call
  double time_s = 0;     // max(compute, memory) + latency
  Bound bound = Bound::kMemory;

  double read_bytes() const { return weight_bytes + activation_read_bytes + kv_read_bytes; }
  double write_bytes() const { return activation_write_bytes + kv_write_bytes; }
  double bytes() const { return read_bytes() + write_bytes(); }
  double intensity() const { return bytes() > 0 ? flops / bytes() : 0.0; }
};

struct StepCost {
  std::vector<OperatorCost> operators;  // per layer, in execution order
  double tokens = 0;                    // tokens the step processes
  double flops = 0;
  double weight_bytes = 0;
  double activation_bytes = 0;
  double kv_read_bytes = 0;
  double kv_write_bytes = 0;
  double bytes = 0;
  double time_s = 0;
  // The step's time split by what limits it: per-call latencies, then the roofline time of
  // memory-bound rows by their bytes and of compute-bound rows as compute.
  double weight_time_s = 0;
  double kv_time_s = 0;
  double activation_time_s = 0;
  double compute_time_s = 0;
  double latency_time_s = 0;
  Bound bound = Bound::kMemory;         // the bound of the rows that take most of the time
  std::vector<double> experts_touched;  // per layer; 0 for layers without a router

  double mean_experts_touched() const;  // over MoE layers
  double intensity() const { return bytes > 0 ? flops / bytes : 0.0; }
};

// Throws kInvalidArgument when the workload does not fit the model (batch, context, retention).
StepCost predict_step(const ModelSpec& spec, const HardwareSpec& hw, const Workload& workload,
                      bool datasheet_only = false);
// Sums the rows of `rows` into one row per operator kind, in order of first appearance.
std::vector<OperatorCost> aggregate_by_operator(const std::vector<OperatorCost>& rows);
// Totals of `rows` (all fields of StepCost except operators, tokens and experts_touched).
StepCost sum_rows(const std::vector<OperatorCost>& rows);

}  // namespace ekva
