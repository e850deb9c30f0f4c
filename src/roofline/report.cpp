#include "roofline/report.h"

#include <fmt/format.h>

#include "core/error.h"

namespace ekva {

RooflineReport make_roofline_report(const ModelSpec& spec, const HardwareSpec& hw,
                                    const Workload& workload, bool datasheet,
                                    const MemoryOptions& memory_options,
                                    const MeasuredTimes* measured) {
  RooflineReport r;
  r.spec = spec;
  r.hw = hw;
  r.workload = workload;
  r.datasheet = datasheet;
  const Workload& w = r.workload;
  r.ceilings = hw.ceilings(datasheet);
  r.step = predict_step(spec, hw, w, datasheet);
  r.by_operator = aggregate_by_operator(r.step.operators);
  r.memory = memory_use(spec, hw, w, r.step, memory_options);
  r.largest_batch = max_batch(spec, hw, w, memory_options);
  r.kv_per_token =
      static_cast<double>(spec.kv_bytes_per_token(1)) * number_format_bytes(w.kv_format);
  r.kv_per_sequence = w.retained.bytes(spec, w.kv_format);
  r.retained_fraction = w.context > 0 ? w.retained.total() / (static_cast<double>(w.context) *
                                                              spec.num_layers * spec.num_kv_heads)
                                      : 1.0;
  r.tokens_per_s =
      (w.phase == Phase::kDecode ? static_cast<double>(w.batch) : r.step.tokens) / r.step.time_s;
  if (measured != nullptr) {
    if (!measured->hardware.empty() && measured->hardware != hw.name) {
      fail(ErrorKind::kInvalidArgument, "{}: measured on '{}', but the hardware is '{}'",
           measured->source, measured->hardware, hw.name);
    }
    r.measured = true;
    r.errors = compare_with_measured(spec, hw, w, *measured, datasheet);
  }
  return r;
}

std::vector<ChartPoint> roofline_chart_points(const RooflineReport& report) {
  std::vector<ChartPoint> points;
  for (const auto& op : report.by_operator) {
    if (op.time_s > 0)
      points.push_back({std::string(operator_name(op.kind)), op.intensity(), op.flops / op.time_s});
  }
  for (const auto& e : report.errors) {
    if (e.bytes > 0) {
      points.push_back({measured_label(e.measured) + " (measured)", e.flops / e.bytes,
                        e.flops / e.measured.time_s, true});
    }
  }
  return points;
}

nlohmann::json roofline_report_json(const RooflineReport& r) {
  const ModelSpec& spec = r.spec;
  const HardwareSpec& hw = r.hw;
  const Workload& w = r.workload;
  const StepCost& step = r.step;
  const Ceilings& ceilings = r.ceilings;
  const auto params = spec.parameters();
  nlohmann::json ops = nlohmann::json::array();
  for (const auto& op : step.operators) ops.push_back(operator_json(op));
  nlohmann::json j = {
      {"model",
       {{"architecture", spec.model_type},
        {"source", r.model_source},
        {"layers", spec.num_layers},
        {"experts", spec.num_experts},
        {"top_k", spec.top_k},
        {"kv_heads", spec.num_kv_heads},
        {"head_dim", spec.head_dim}}},
      {"hardware",
       {{"name", hw.name},
        {"source", hw.source},
        {"ceilings", r.datasheet || !hw.measured ? "datasheet" : "measured"},
        {"read_bandwidth", ceilings.read_bandwidth},
        {"write_bandwidth", ceilings.write_bandwidth},
        {"peak_bf16_flops", ceilings.peak(PeakFormat::kBF16)},
        {"peak_fp32_flops", ceilings.peak(PeakFormat::kFP32)},
        {"memory_bytes", hw.memory_bytes}}},
      {"workload",
       {{"phase", std::string(phase_name(w.phase))},
        {"batch", w.batch},
        {"context", w.context},
        {"kv_dtype", std::string(number_format_name(w.kv_format))},
        {"weight_dtype", std::string(number_format_name(w.weight_format))},
        {"activation_dtype", std::string(number_format_name(w.activation_format))},
        {"kv", r.retention},
        {"kv_retained_fraction", r.retained_fraction},
        {"routing", w.routing.is_uniform() ? "uniform" : r.routing_source}}},
      {"kv_bytes_per_token", r.kv_per_token},
      {"kv_bytes_per_sequence", r.kv_per_sequence},
      {"total_params", params.total},
      {"active_params_per_token", params.active_per_token},
      {"experts_touched_per_layer", step.mean_experts_touched()},
      {"experts_touched_by_layer", step.experts_touched},
      {"tokens", step.tokens},
      {"time_s", step.time_s},
      {"tokens_per_s", r.tokens_per_s},
      {"flops", step.flops},
      {"bytes", step.bytes},
      {"weight_bytes", step.weight_bytes},
      {"activation_bytes", step.activation_bytes},
      {"kv_read_bytes", step.kv_read_bytes},
      {"kv_write_bytes", step.kv_write_bytes},
      {"intensity", step.intensity()},
      {"bound", std::string(bound_name(step.bound))},
      {"time_breakdown_s",
       {{"weights", step.weight_time_s},
        {"kv", step.kv_time_s},
        {"activations", step.activation_time_s},
        {"compute", step.compute_time_s},
        {"latency", step.latency_time_s}}},
      {"memory", memory_json(r.memory, r.largest_batch)},
      {"operators", ops},
  };
  if (r.measured) {
    nlohmann::json m = nlohmann::json::array();
    for (const auto& e : r.errors) {
      m.push_back({{"operator", e.measured.name},
                   {"label", measured_label(e.measured)},
                   {"measured_s", e.measured.time_s},
                   {"predicted_s", e.predicted_s},
                   {"error", e.error}});
    }
    j["measured"] = m;
  }
  return j;
}

nlohmann::json operator_json(const OperatorCost& r) {
  return {{"operator", std::string(operator_name(r.kind))},
          {"class", std::string(operator_class_name(operator_class(r.kind)))},
          {"layer", r.layer},
          {"rows", r.count},
          {"flops", r.flops},
          {"bytes", r.bytes()},
          {"weight_bytes", r.weight_bytes},
          {"activation_read_bytes", r.activation_read_bytes},
          {"activation_write_bytes", r.activation_write_bytes},
          {"kv_read_bytes", r.kv_read_bytes},
          {"kv_write_bytes", r.kv_write_bytes},
          {"intensity", r.intensity()},
          {"peak_format", std::string(peak_format_name(r.peak_format))},
          {"efficiency", r.efficiency},
          {"compute_time_s", r.compute_time_s},
          {"memory_time_s", r.memory_time_s},
          {"latency_s", r.latency_s},
          {"time_s", r.time_s},
          {"bound", std::string(bound_name(r.bound))}};
}

nlohmann::json memory_json(const MemoryUse& m, int64_t largest_batch) {
  return {{"weight_bytes", m.weight_bytes},
          {"kv_bytes", m.kv_bytes},
          {"activation_bytes", m.activation_bytes},
          {"workspace_bytes", m.workspace_bytes},
          {"total_bytes", m.total_bytes},
          {"capacity_bytes", m.capacity_bytes},
          {"fits", m.fits()},
          {"max_batch", largest_batch}};
}

std::string measured_label(const MeasuredOperator& m) {
  std::string label = m.name;
  if (m.layer) label += fmt::format(" L{}", *m.layer);
  if (m.batch) label += fmt::format(" b{}", *m.batch);
  if (m.context) label += fmt::format(" ctx{}", *m.context);
  if (m.kv_fraction) label += fmt::format(" kv{:g}", *m.kv_fraction);
  return label;
}

}  // namespace ekva
