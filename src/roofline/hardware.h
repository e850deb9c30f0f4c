#pragma once
// A device as the roofline model sees it: memory, bandwidth and dense peaks from its datasheet,
// overridden by a measured profile where one was recorded. Specs live in data/hardware/*.json
// (schema in docs/ROOFLINE.md).
#include <array>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "roofline/number_format.h"
#include "roofline/operators.h"

namespace ekva {

// The ceilings one prediction uses.
struct Ceilings {
  double read_bandwidth = 0;                         // bytes/s of a streaming read
  double write_bandwidth = 0;                        // bytes/s of a streaming write
  std::array<double, kNumPeakFormats> peak_flops{};  // FLOP/s (OP/s for int8); 0: not supported
  // The peak of `format`, else of bf16, else of fp32: a device without fp8 or int8 units runs those
  // GEMMs by converting to a format it has (weight-only kernels do exactly that).
  double peak(PeakFormat format) const;
  PeakFormat effective_format(PeakFormat format) const;
};

struct MeasuredProfile {
  double read_bandwidth = 0;  // bytes/s; 0: not measured
  double copy_bandwidth = 0;  // bytes/s counting read + write; 0: not measured
  std::array<double, kNumPeakFormats> peak_flops{};  // 0: not measured
  // Attained fraction of the roofline time per operator name or operator class (gemm, attention,
  // elementwise); an operator name wins over its class.
  std::map<std::string, double> operator_efficiency;
  // The same in a prompt's step, whose operators run as other kernels (prefill attention on the
  // tensor cores, routed experts as large grouped products); it wins over operator_efficiency.
  std::map<std::string, double> prefill_efficiency;
  // Seconds each call of an operator costs on top of its roofline time (launch, ramp-up and tail of
  // a kernel), by operator name or class like the efficiencies.
  std::map<std::string, double> operator_latency;
  std::string method;  // how the figures were measured
};

struct HardwareSpec {
  std::string name;
  std::string description;
  std::string kind;    // "gpu" or "cpu"
  std::string source;  // the file it came from
  double memory_bytes = 0;
  double memory_bandwidth = 0;                       // bytes/s, datasheet
  std::array<double, kNumPeakFormats> peak_flops{};  // datasheet dense peaks; 0: not supported
  int sm_count = 0;     // streaming multiprocessors, compute units or cores; 0: not given
  double l2_bytes = 0;  // 0: not given
  std::string interconnect;
  double interconnect_bandwidth = 0;  // bytes/s; 0: none
  std::vector<std::string> references;
  std::optional<MeasuredProfile> measured;

  // Datasheet figures, overridden field by field by the measured profile unless `datasheet_only`.
  Ceilings ceilings(bool datasheet_only) const;
  // The measured efficiency of an operator (by name, else by class; in a prefill step the prefill
  // table's first), 1 when none was recorded or `datasheet_only`.
  double efficiency(OperatorKind op, Phase phase, bool datasheet_only) const;
  // The same for an operator that runs as kernels of class `runs_as` (routed experts as one GEMM
  // per expert): that class's entries alone.
  double efficiency_as(OperatorClass runs_as, Phase phase, bool datasheet_only) const;
  // The measured fixed cost of one call of an operator, 0 when none was recorded or
  // `datasheet_only`.
  double latency(OperatorKind op, bool datasheet_only) const;
};

// Validates every field; errors name `source`, the field and the value.
HardwareSpec parse_hardware(const nlohmann::json& j, const std::string& source);
HardwareSpec load_hardware_file(const std::filesystem::path& path);
// A name of a file in the data directory (data/hardware/NAME.json), or a path to a JSON file.
HardwareSpec find_hardware(const std::string& name_or_path);
// The names of the hardware files in the data directory, sorted.
std::vector<std::string> list_hardware_names();
std::filesystem::path hardware_data_dir();

}  // namespace ekva
