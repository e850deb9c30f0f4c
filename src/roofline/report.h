#pragma once
// What `ekva roofline` reports for one workload: the step's cost by operator, the memory it needs,
// the largest batch that fits and, when measured times are given, the prediction errors. Built in
// the library so that every front end (the CLI, benchmarks, the server) reports the same numbers.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "arch/model_spec.h"
#include "roofline/cost_model.h"
#include "roofline/hardware.h"
#include "roofline/measured.h"
#include "roofline/memory_model.h"
#include "roofline/svg_chart.h"

namespace ekva {

struct RooflineReport {
  ModelSpec spec;
  std::string model_source;    // where the spec came from (a model directory or config.json)
  std::string routing_source;  // the routing statistics file, when the routing is not uniform
  HardwareSpec hw;
  Workload workload;
  bool datasheet = false;  // datasheet ceilings even where a measured profile exists
  std::string retention;   // "full KV" or "plan FILE"
  Ceilings ceilings;
  StepCost step;
  std::vector<OperatorCost> by_operator;
  MemoryUse memory;
  int64_t largest_batch = 0;
  double kv_per_token = 0;       // bytes of a full KV token in the workload's KV format
  double kv_per_sequence = 0;    // bytes of one sequence's KV as kept
  double retained_fraction = 1;  // of the context, over all (layer, KV head)
  double tokens_per_s = 0;
  bool measured = false;
  std::vector<PredictionError> errors;  // against the measured times, when given
};

// Throws kInvalidArgument when the measured times were taken on other hardware.
RooflineReport make_roofline_report(const ModelSpec& spec, const HardwareSpec& hw,
                                    const Workload& workload, bool datasheet,
                                    const MemoryOptions& memory_options,
                                    const MeasuredTimes* measured);

nlohmann::json roofline_report_json(const RooflineReport& report);
// The operators (and measured points) as points of a Roofline chart.
std::vector<ChartPoint> roofline_chart_points(const RooflineReport& report);

nlohmann::json operator_json(const OperatorCost& op);
nlohmann::json memory_json(const MemoryUse& memory, int64_t largest_batch);
// "name L3 b16 ctx4096 kv0.2": a measured operator and the workload it was measured at.
std::string measured_label(const MeasuredOperator& m);

}  // namespace ekva
