#include "roofline/memory_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ekva {

MemoryUse memory_use(const ModelSpec& spec, const HardwareSpec& hw, const Workload& workload,
                     const StepCost& step, const MemoryOptions& options) {
  const auto valid = [](double bytes) { return bytes >= 0 && std::isfinite(bytes); };
  if (!valid(options.workspace_bytes) || !valid(options.capacity_bytes)) {
    fail(ErrorKind::kInvalidArgument,
         "memory options must be finite and not negative (workspace {} bytes, cap {} bytes)",
         options.workspace_bytes, options.capacity_bytes);
  }
  MemoryUse m;
  m.weight_bytes =
      static_cast<double>(spec.parameters().total) * number_format_bytes(workload.weight_format);
  const KvRetention retained = workload.retained.tokens.empty()
                                   ? KvRetention::full(spec, workload.context)
                                   : workload.retained;
  m.kv_bytes = static_cast<double>(workload.batch) * retained.bytes(spec, workload.kv_format);
  // Operators run one after another: the peak is the largest operator's inputs and outputs, plus
  // the residual stream that lives across the layer.
  double largest = 0;
  for (const auto& op : step.operators) {
    largest = std::max(largest, op.activation_read_bytes + op.activation_write_bytes);
  }
  m.activation_bytes =
      largest + step.tokens * spec.hidden_size * number_format_bytes(workload.activation_format);
  m.workspace_bytes = options.workspace_bytes;
  m.total_bytes = m.weight_bytes + m.kv_bytes + m.activation_bytes + m.workspace_bytes;
  m.capacity_bytes = options.capacity_bytes > 0 ? std::min(options.capacity_bytes, hw.memory_bytes)
                                                : hw.memory_bytes;
  return m;
}

int64_t max_batch(const ModelSpec& spec, const HardwareSpec& hw, Workload workload,
                  const MemoryOptions& options, int64_t limit) {
  const auto fits = [&](int64_t batch) {
    workload.batch = batch;
    return memory_use(spec, hw, workload, predict_step(spec, hw, workload), options).fits();
  };
  if (!fits(1)) return 0;
  int64_t lo = 1;  // fits
  int64_t hi = limit + 1;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace ekva
