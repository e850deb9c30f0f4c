#include "roofline/measured.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>

#include "core/error.h"
#include "io/json_file.h"
#include "io/model_limits.h"

namespace ekva {
namespace {

using nlohmann::json;

bool row_matches(const OperatorCost& row, const std::string& name) {
  const std::string_view op = operator_name(row.kind);
  if (name == "step") return true;
  if (name == "layer") return row.layer >= 0;
  if (name == "attention") {
    return row.kind == OperatorKind::kAttentionScores || row.kind == OperatorKind::kAttentionValues;
  }
  return op == name;
}

int64_t integer_field(const json& e, const char* key, const std::string& where, int64_t min,
                      int64_t max) {
  const json& v = e[key];
  if (!json_integer_in(v, min, max)) {
    fail(ErrorKind::kInvalidFile, "{}: '{}' must be an integer in [{}, {}], got {}", where, key,
         min, max, json_excerpt(v));
  }
  return v.get<int64_t>();
}

}  // namespace

MeasuredTimes load_measured_times(const std::filesystem::path& path) {
  const json j = read_json_file(path);
  MeasuredTimes m;
  m.source = path.string();
  if (!j.is_object() || !j.contains("measurements") || !j["measurements"].is_array()) {
    fail(ErrorKind::kInvalidFile, "{}: expected an object with a list 'measurements'", m.source);
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "hardware" && key != "description" && key != "measurements") {
      fail(ErrorKind::kInvalidFile,
           "{}: unknown field '{}' (allowed: hardware, description, measurements)", m.source, key);
    }
    if (key != "measurements" && !value.is_string()) {
      fail(ErrorKind::kInvalidFile, "{}: '{}' must be a string", m.source, key);
    }
  }
  if (j.contains("hardware")) m.hardware = j["hardware"].get<std::string>();
  if (j.contains("description")) m.description = j["description"].get<std::string>();
  static const std::set<std::string> allowed = {"operator", "layer",       "phase",
                                                "batch",    "context",     "kv_dtype",
                                                "time_s",   "kv_fraction", "note"};
  int index = 0;
  for (const json& e : j["measurements"]) {
    const std::string where = fmt::format("{} measurements[{}]", m.source, index++);
    if (!e.is_object()) fail(ErrorKind::kInvalidFile, "{}: expected an object", where);
    for (const auto& [key, value] : e.items()) {
      if (!allowed.count(key)) fail(ErrorKind::kInvalidFile, "{}: unknown field '{}'", where, key);
    }
    MeasuredOperator op;
    if (!e.contains("operator") || !e["operator"].is_string()) {
      fail(ErrorKind::kInvalidFile, "{}: missing string field 'operator'", where);
    }
    op.name = e["operator"].get<std::string>();
    if (!find_operator(op.name) && op.name != "attention" && op.name != "layer" &&
        op.name != "step") {
      fail(ErrorKind::kInvalidFile,
           "{}: unknown operator '{}' (an operator name, attention, layer or step)", where,
           op.name);
    }
    if (!e.contains("time_s") || !e["time_s"].is_number() || !(e["time_s"].get<double>() > 0) ||
        !std::isfinite(e["time_s"].get<double>())) {
      fail(ErrorKind::kInvalidFile, "{}: 'time_s' must be a positive number", where);
    }
    op.time_s = e["time_s"].get<double>();
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    if (e.contains("layer")) {
      op.layer = static_cast<int>(integer_field(e, "layer", where, 0, model_limits::kLayers - 1));
    }
    if (e.contains("batch")) op.batch = integer_field(e, "batch", where, 1, kMax);
    if (e.contains("context")) op.context = integer_field(e, "context", where, 1, kMax);
    if (e.contains("phase")) {
      if (!e["phase"].is_string())
        fail(ErrorKind::kInvalidFile, "{}: 'phase' must be a string", where);
      op.phase = parse_phase(e["phase"].get<std::string>(), where + " phase");
    }
    if (e.contains("kv_dtype")) {
      if (!e["kv_dtype"].is_string())
        fail(ErrorKind::kInvalidFile, "{}: 'kv_dtype' must be a string", where);
      op.kv_format = parse_number_format(e["kv_dtype"].get<std::string>(), where + " kv_dtype");
    }
    if (e.contains("kv_fraction")) {
      const json& v = e["kv_fraction"];
      if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1) {
        fail(ErrorKind::kInvalidFile, "{}: 'kv_fraction' must be in (0, 1], got {}", where,
             json_excerpt(v));
      }
      op.kv_fraction = v.get<double>();
    }
    if (e.contains("note")) op.note = e["note"].is_string() ? e["note"].get<std::string>() : "";
    m.measurements.push_back(op);
  }
  return m;
}

std::vector<PredictionError> compare_with_measured(const ModelSpec& spec, const HardwareSpec& hw,
                                                   const Workload& base,
                                                   const MeasuredTimes& measured,
                                                   bool datasheet_only) {
  std::vector<PredictionError> out;
  for (const MeasuredOperator& m : measured.measurements) {
    PredictionError p;
    p.measured = m;
    Workload& w = p.workload;
    w = base;
    if (m.phase) w.phase = *m.phase;
    if (m.batch) w.batch = *m.batch;
    if (m.kv_format) w.kv_format = *m.kv_format;
    if (m.context || m.kv_fraction) {
      if (m.context) w.context = *m.context;
      w.retained = KvRetention::fraction(spec, w.context, m.kv_fraction.value_or(1.0));
    }
    const StepCost step = predict_step(spec, hw, w, datasheet_only);
    std::set<int> layers;
    for (const auto& row : step.operators) {
      if (!row_matches(row, m.name)) continue;
      if (m.layer && row.layer >= 0 && row.layer != *m.layer) continue;
      if (m.name != "step") layers.insert(row.layer);
      p.predicted_s += row.time_s;
      p.flops += row.flops;
      p.bytes += row.bytes();
    }
    if (m.name != "step" && layers.empty()) {
      fail(ErrorKind::kInvalidArgument, "{}: the model has no operator '{}'{}", measured.source,
           m.name, m.layer ? fmt::format(" in layer {}", *m.layer) : "");
    }
    // Without a layer, a per-layer operator's measurement is one call: compare with the mean.
    const double calls = (m.layer || m.name == "step" || layers.count(-1)) ? 1.0 : layers.size();
    p.predicted_s /= calls;
    p.flops /= calls;
    p.bytes /= calls;
    p.error = (p.predicted_s - m.time_s) / m.time_s;
    out.push_back(p);
  }
  return out;
}

}  // namespace ekva
