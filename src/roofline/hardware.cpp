#include "roofline/hardware.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "core/error.h"
#include "io/json_file.h"

namespace ekva {
namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGBps = 1e9;
constexpr double kTFlops = 1e12;

class FieldReader {
 public:
  FieldReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) fail(ErrorKind::kInvalidFile, "{}: expected a JSON object", where_);
  }

  // Typos in field names would silently fall back to defaults, so unknown fields are errors.
  void allow_only(std::initializer_list<const char*> keys) const {
    const std::set<std::string> allowed(keys.begin(), keys.end());
    for (const auto& [key, value] : j_.items()) {
      if (!allowed.count(key)) {
        std::string list;
        for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
        fail(ErrorKind::kInvalidFile, "{}: unknown field '{}' (allowed: {})", where_, key, list);
      }
    }
  }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  std::string string(const char* key) const {
    if (!has(key)) fail(ErrorKind::kInvalidFile, "{}: missing field '{}'", where_, key);
    if (!j_[key].is_string())
      fail(ErrorKind::kInvalidFile, "{}: field '{}' must be a string, got {}", where_, key,
           json_excerpt(j_[key]));
    return j_[key].get<std::string>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    return has(key) ? string(key) : fallback;
  }
  double positive(const char* key) const {
    if (!has(key)) fail(ErrorKind::kInvalidFile, "{}: missing field '{}'", where_, key);
    return positive_value(key);
  }
  // 0 when absent or null.
  double positive_or_zero(const char* key) const { return has(key) ? positive_value(key) : 0.0; }
  const json& raw(const char* key) const { return j_[key]; }
  const std::string& where() const { return where_; }

 private:
  double positive_value(const char* key) const {
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
      fail(ErrorKind::kInvalidFile, "{}: field '{}' must be a positive number, got {}", where_, key,
           json_excerpt(v));
    }
    return v.get<double>();
  }
  const json& j_;
  std::string where_;
};

std::array<double, kNumPeakFormats> parse_peaks(const json& j, const std::string& where) {
  FieldReader r(j, where);
  r.allow_only({"fp32", "tf32", "bf16", "fp8", "int8"});
  std::array<double, kNumPeakFormats> peaks{};
  for (int f = 0; f < kNumPeakFormats; ++f) {
    const std::string key(peak_format_name(static_cast<PeakFormat>(f)));
    peaks[f] = r.positive_or_zero(key.c_str()) * kTFlops;
  }
  return peaks;
}

// {operator name or class: value} with values in [min, max], scaled by `scale`.
std::map<std::string, double> parse_operator_table(const FieldReader& r, const char* key,
                                                   const std::string& where, double min, double max,
                                                   double scale) {
  std::map<std::string, double> table;
  if (!r.has(key)) return table;
  const std::string tw = where + " " + key;
  const json& j = r.raw(key);
  if (!j.is_object()) fail(ErrorKind::kInvalidFile, "{}: expected a JSON object", tw);
  for (const auto& [name, value] : j.items()) {
    if (!find_operator(name) && !find_operator_class(name)) {
      std::string names;
      for (OperatorKind k : all_operators()) names += std::string(operator_name(k)) + ", ";
      fail(ErrorKind::kInvalidFile,
           "{}: '{}' is neither an operator ({}) nor a class (gemm, attention, elementwise)", tw,
           name, names.substr(0, names.size() - 2));
    }
    if (!value.is_number() || !(value.get<double>() >= min) || value.get<double>() > max) {
      fail(ErrorKind::kInvalidFile, "{}: '{}' is {}; expected a number in [{}, {}]", tw, name,
           json_excerpt(value), min, max);
    }
    table[name] = value.get<double>() * scale;
  }
  return table;
}

MeasuredProfile parse_measured(const json& j, const std::string& where) {
  FieldReader r(j, where);
  r.allow_only({"read_bandwidth_gbps", "copy_bandwidth_gbps", "peak_tflops", "operator_efficiency",
                "prefill_operator_efficiency", "operator_latency_us", "method"});
  MeasuredProfile m;
  m.method = r.string("method");
  m.read_bandwidth = r.positive_or_zero("read_bandwidth_gbps") * kGBps;
  m.copy_bandwidth = r.positive_or_zero("copy_bandwidth_gbps") * kGBps;
  if (m.copy_bandwidth > 0 && m.read_bandwidth > 0 && m.copy_bandwidth >= 2 * m.read_bandwidth) {
    // A copy moves one read and one write per byte; at twice the read rate writes would be free.
    fail(ErrorKind::kInvalidFile,
         "{}: copy_bandwidth_gbps {} must be below twice read_bandwidth_gbps {}", where,
         m.copy_bandwidth / kGBps, m.read_bandwidth / kGBps);
  }
  if (r.has("peak_tflops"))
    m.peak_flops = parse_peaks(r.raw("peak_tflops"), where + " peak_tflops");
  m.operator_efficiency = parse_operator_table(r, "operator_efficiency", where, 1e-9, 2.0, 1.0);
  m.prefill_efficiency =
      parse_operator_table(r, "prefill_operator_efficiency", where, 1e-9, 2.0, 1.0);
  m.operator_latency = parse_operator_table(r, "operator_latency_us", where, 0.0, 1e4, 1e-6);
  return m;
}

}  // namespace

double Ceilings::peak(PeakFormat format) const {
  return peak_flops[static_cast<int>(effective_format(format))];
}

PeakFormat Ceilings::effective_format(PeakFormat format) const {
  if (peak_flops[static_cast<int>(format)] > 0) return format;
  if (peak_flops[static_cast<int>(PeakFormat::kBF16)] > 0) return PeakFormat::kBF16;
  return PeakFormat::kFP32;
}

Ceilings HardwareSpec::ceilings(bool datasheet_only) const {
  Ceilings c;
  c.read_bandwidth = memory_bandwidth;
  c.write_bandwidth = memory_bandwidth;
  c.peak_flops = peak_flops;
  if (datasheet_only || !measured) return c;
  const MeasuredProfile& m = *measured;
  if (m.read_bandwidth > 0) {
    c.read_bandwidth = m.read_bandwidth;
    c.write_bandwidth = m.read_bandwidth;
  }
  if (m.copy_bandwidth > 0) {
    // A copy of n bytes takes n / read + n / write = 2n / copy.
    c.write_bandwidth = 1.0 / (2.0 / m.copy_bandwidth - 1.0 / c.read_bandwidth);
  }
  for (int f = 0; f < kNumPeakFormats; ++f) {
    if (m.peak_flops[f] > 0) c.peak_flops[f] = m.peak_flops[f];
  }
  return c;
}

namespace {

const double* find_entry(const std::map<std::string, double>& table, std::string_view key) {
  const auto it = table.find(std::string(key));
  return it != table.end() ? &it->second : nullptr;
}

// The entry of `op`, else of its class, else `fallback`.
double lookup(const std::map<std::string, double>& table, OperatorKind op, double fallback) {
  if (const double* v = find_entry(table, operator_name(op))) return *v;
  if (const double* v = find_entry(table, operator_class_name(operator_class(op)))) return *v;
  return fallback;
}

}  // namespace

double HardwareSpec::efficiency(OperatorKind op, Phase phase, bool datasheet_only) const {
  if (datasheet_only || !measured) return 1.0;
  const double general = lookup(measured->operator_efficiency, op, 1.0);
  return phase == Phase::kPrefill ? lookup(measured->prefill_efficiency, op, general) : general;
}

double HardwareSpec::efficiency_as(OperatorClass runs_as, Phase phase, bool datasheet_only) const {
  if (datasheet_only || !measured) return 1.0;
  const std::string_view key = operator_class_name(runs_as);
  if (const double* v =
          phase == Phase::kPrefill ? find_entry(measured->prefill_efficiency, key) : nullptr) {
    return *v;
  }
  const double* v = find_entry(measured->operator_efficiency, key);
  return v != nullptr ? *v : 1.0;
}

double HardwareSpec::latency(OperatorKind op, bool datasheet_only) const {
  if (datasheet_only || !measured) return 0.0;
  return lookup(measured->operator_latency, op, 0.0);
}

HardwareSpec parse_hardware(const json& j, const std::string& source) {
  FieldReader r(j, source);
  r.allow_only({"name", "description", "kind", "memory_gib", "memory_bandwidth_gbps", "peak_tflops",
                "sm_count", "l2_mib", "interconnect", "references", "measured", "notes"});
  HardwareSpec hw;
  hw.source = source;
  hw.name = r.string("name");
  if (hw.name.empty() || !std::all_of(hw.name.begin(), hw.name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
      })) {
    fail(ErrorKind::kInvalidFile, "{}: name '{}' must be letters, digits, '-' or '_'", source,
         hw.name);
  }
  hw.description = r.string_or("description", hw.name);
  hw.kind = r.string("kind");
  if (hw.kind != "gpu" && hw.kind != "cpu") {
    fail(ErrorKind::kInvalidFile, "{}: kind must be \"gpu\" or \"cpu\", got \"{}\"", source,
         hw.kind);
  }
  hw.memory_bytes = r.positive("memory_gib") * kGiB;
  hw.memory_bandwidth = r.positive("memory_bandwidth_gbps") * kGBps;
  if (!r.has("peak_tflops"))
    fail(ErrorKind::kInvalidFile, "{}: missing field 'peak_tflops'", source);
  hw.peak_flops = parse_peaks(r.raw("peak_tflops"), source + " peak_tflops");
  if (hw.peak_flops[static_cast<int>(PeakFormat::kFP32)] <= 0) {
    fail(ErrorKind::kInvalidFile, "{}: peak_tflops.fp32 is required (every device computes fp32)",
         source);
  }
  if (r.has("sm_count")) {
    const json& v = r.raw("sm_count");
    if (!json_integer_in(v, 1, 1000000)) {
      fail(ErrorKind::kInvalidFile, "{}: field 'sm_count' must be a positive integer, got {}",
           source, json_excerpt(v));
    }
    hw.sm_count = v.get<int>();
  }
  hw.l2_bytes = r.positive_or_zero("l2_mib") * kMiB;
  if (r.has("interconnect")) {
    const std::string where = source + " interconnect";
    FieldReader ic(r.raw("interconnect"), where);
    ic.allow_only({"name", "bandwidth_gbps"});
    hw.interconnect = ic.string("name");
    hw.interconnect_bandwidth = ic.positive("bandwidth_gbps") * kGBps;
  }
  if (r.has("references")) {
    const json& refs = r.raw("references");
    if (!refs.is_array()) fail(ErrorKind::kInvalidFile, "{}: 'references' must be a list", source);
    for (const json& ref : refs) {
      if (!ref.is_string())
        fail(ErrorKind::kInvalidFile, "{}: 'references' holds a non-string {}", source,
             json_excerpt(ref));
      hw.references.push_back(ref.get<std::string>());
    }
  }
  if (r.has("measured")) hw.measured = parse_measured(r.raw("measured"), source + " measured");
  return hw;
}

HardwareSpec load_hardware_file(const std::filesystem::path& path) {
  return parse_hardware(read_json_file(path), path.string());
}

std::filesystem::path hardware_data_dir() {
  return std::filesystem::path(EKVA_DATA_DIR) / "hardware";
}

std::vector<std::string> list_hardware_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(hardware_data_dir(), ec)) {
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

HardwareSpec find_hardware(const std::string& name_or_path) {
  const std::filesystem::path as_path(name_or_path);
  if (as_path.extension() == ".json" || name_or_path.find('/') != std::string::npos) {
    return load_hardware_file(as_path);
  }
  const auto file = hardware_data_dir() / (name_or_path + ".json");
  if (!path_exists(file)) {
    std::string names;
    for (const auto& n : list_hardware_names()) names += (names.empty() ? "" : ", ") + n;
    fail(ErrorKind::kNotFound,
         "hardware '{}': no file {} (known: {}); pass a path to your own file", name_or_path,
         file.string(), names);
  }
  HardwareSpec hw = load_hardware_file(file);
  if (hw.name != name_or_path) {
    fail(ErrorKind::kInvalidFile, "{}: name '{}' does not match its file name '{}'", file.string(),
         hw.name, name_or_path);
  }
  return hw;
}

}  // namespace ekva
