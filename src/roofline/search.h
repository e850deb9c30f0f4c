#pragma once
// Which total KV budget and batch meet a decode target on a device, what each budget buys over
// full KV, and the knee below which a smaller KV stops paying (weights or compute dominate).
#include <string>
#include <vector>

#include "roofline/memory_model.h"

namespace ekva {

enum class TargetKind {
  kMaxTimePerToken,  // value: seconds per decode step (each sequence gets one token per step)
  kMinThroughput,    // value: generated tokens per second over the batch
  kMemoryCap,        // value: bytes of device memory the configuration may use
};
std::string_view target_kind_name(TargetKind kind);

struct SearchTarget {
  TargetKind kind = TargetKind::kMaxTimePerToken;
  double value = 0;
};

struct SearchOptions {
  std::vector<double> fractions;  // KV fractions of the context to try; empty: 1, 2^-0.5, ... 1/256
  int64_t batch_limit = 4096;     // the engine's largest batch
  double knee_threshold = 0.05;   // a smaller budget must gain more than this to pay
  MemoryOptions memory;
  bool datasheet_only = false;
};

struct SearchPoint {
  double kv_fraction = 1;
  double kv_bytes_per_sequence = 0;
  int64_t memory_batch = 0;  // the largest batch that fits in memory
  bool feasible = false;
  int64_t batch = 0;
  double time_s = 0;          // per decode step at `batch`
  double tokens_per_s = 0;    // batch / time_s
  double objective = 0;       // higher is better: tokens/s, or steps/s for a throughput target
  double gain_over_full = 0;  // objective / full KV's objective; 0 when full KV is infeasible
  std::string limited_by;     // what stops a larger batch: memory, target, batch limit
  StepCost step;
  MemoryUse memory;
};

struct SearchResult {
  SearchTarget target;
  std::vector<SearchPoint> points;  // by decreasing KV fraction; points[0] is full KV
  int chosen = -1;                  // the largest budget that meets the target; -1: none does
  int knee = -1;  // the largest budget within knee_threshold of the best objective
  // What dominates the step time at the knee: weights, kv, activations, compute or latency.
  std::string knee_dominated_by;
};

// `base` sets the phase-independent workload: context, formats, routing (batch and retention are
// searched; the phase is decode).
SearchResult search_kv_budget(const ModelSpec& spec, const HardwareSpec& hw, const Workload& base,
                              const SearchTarget& target, const SearchOptions& options);

}  // namespace ekva
