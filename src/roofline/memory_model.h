#pragma once
// Device memory a serving configuration needs: weights, KV (full or as retained), the largest
// live activations of a step, and a fixed workspace (runtime, GEMM workspaces, allocator slack).
#include <cstdint>

#include "roofline/cost_model.h"

namespace ekva {

struct MemoryOptions {
  double workspace_bytes = 1024.0 * 1024.0 * 1024.0;
  double capacity_bytes = 0;  // 0: the device's memory
};

struct MemoryUse {
  double weight_bytes = 0;
  double kv_bytes = 0;
  double activation_bytes = 0;
  double workspace_bytes = 0;
  double total_bytes = 0;
  double capacity_bytes = 0;
  bool fits() const { return total_bytes <= capacity_bytes; }
};

// Memory of `workload` given its predicted `step` (whose rows size the activations).
MemoryUse memory_use(const ModelSpec& spec, const HardwareSpec& hw, const Workload& workload,
                     const StepCost& step, const MemoryOptions& options);
// The largest batch (at most `limit`) whose memory fits; 0 when not even one sequence fits.
int64_t max_batch(const ModelSpec& spec, const HardwareSpec& hw, Workload workload,
                  const MemoryOptions& options, int64_t limit = int64_t{1} << 20);

}  // namespace ekva
