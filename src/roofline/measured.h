#pragma once
// Measured per-operator times (JSON, schema in docs/ROOFLINE.md) and the prediction error of the
// cost model against them.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "roofline/cost_model.h"

namespace ekva {

struct MeasuredOperator {
  // An operator name, or "attention" (scores + values), "layer" (one decoder layer), "step".
  std::string name;
  std::optional<int> layer;  // absent: the mean over the layers that have the operator
  // Absent fields take the command's workload.
  std::optional<Phase> phase;
  std::optional<int64_t> batch;
  std::optional<int64_t> context;
  std::optional<NumberFormat> kv_format;
  std::optional<double> kv_fraction;
  double time_s = 0;
  std::string note;
};

struct MeasuredTimes {
  std::string source;
  std::string hardware;  // empty: not stated
  std::string description;
  std::vector<MeasuredOperator> measurements;
};

MeasuredTimes load_measured_times(const std::filesystem::path& path);

struct PredictionError {
  MeasuredOperator measured;
  Workload workload;  // the workload the prediction used
  double predicted_s = 0;
  double flops = 0;
  double bytes = 0;
  double error = 0;  // (predicted - measured) / measured
};

// Throws kInvalidArgument when an entry names an operator the model does not have (or a layer it
// lacks).
std::vector<PredictionError> compare_with_measured(const ModelSpec& spec, const HardwareSpec& hw,
                                                   const Workload& base,
                                                   const MeasuredTimes& measured,
                                                   bool datasheet_only);

}  // namespace ekva
