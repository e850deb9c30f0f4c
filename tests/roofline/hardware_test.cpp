#include "roofline/hardware.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ekva {
namespace {

using nlohmann::json;

json minimal_gpu() {
  return json::parse(R"({
    "name": "test-gpu", "kind": "gpu", "memory_gib": 10, "memory_bandwidth_gbps": 1000,
    "peak_tflops": {"fp32": 10, "bf16": 100}
  })");
}

// The error message of parsing `j`, which must fail with kInvalidFile.
std::string rejection(const json& j) {
  try {
    parse_hardware(j, "bad.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << j.dump();
  return "";
}

TEST(Hardware, EveryShippedFileLoadsUnderItsOwnName) {
  const auto names = list_hardware_names();
  for (const char* expected : {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l40s",
                               "rtx-4090", "b200", "mi300x"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  int cpus = 0;
  for (const auto& name : names) {
    const HardwareSpec hw = find_hardware(name);
    EXPECT_EQ(hw.name, name);
    EXPECT_GT(hw.memory_bytes, 0);
    EXPECT_GT(hw.peak_flops[static_cast<int>(PeakFormat::kFP32)], 0);
    EXPECT_FALSE(hw.references.empty()) << name << " cites no source";
    cpus += hw.kind == "cpu";
  }
  EXPECT_GE(cpus, 1);
}

TEST(Hardware, H200DatasheetAndMeasuredCeilings) {
  const HardwareSpec hw = find_hardware("h200");
  const Ceilings sheet = hw.ceilings(true);
  EXPECT_DOUBLE_EQ(sheet.read_bandwidth, 4.8e12);
  EXPECT_NEAR(sheet.peak(PeakFormat::kBF16), 989.4e12, 1e9);
  const Ceilings measured = hw.ceilings(false);
  EXPECT_DOUBLE_EQ(measured.read_bandwidth, 4.5e12);
  EXPECT_DOUBLE_EQ(measured.peak(PeakFormat::kBF16), 757e12);
  // Unmeasured formats keep the datasheet.
  EXPECT_DOUBLE_EQ(measured.peak(PeakFormat::kFP8), sheet.peak(PeakFormat::kFP8));
  // A copy of n bytes at 4.16 TB/s (read + write) takes 2n / 4.16e12 = n / 4.5e12 + n / write.
  const double write = 1.0 / (2.0 / 4.16e12 - 1.0 / 4.5e12);
  EXPECT_NEAR(measured.write_bandwidth, write, 1e6);
  EXPECT_NEAR(write, 3.868e12, 1e9);
}

TEST(Hardware, MissingFormatsFallBackToBf16ThenFp32) {
  const HardwareSpec a100 = find_hardware("a100-80gb");
  const Ceilings c = a100.ceilings(false);
  EXPECT_EQ(c.effective_format(PeakFormat::kFP8), PeakFormat::kBF16);
  EXPECT_DOUBLE_EQ(c.peak(PeakFormat::kFP8), 312e12);
  const HardwareSpec gpu = parse_hardware(
      json::parse(R"({"name": "g", "kind": "gpu", "memory_gib": 1, "memory_bandwidth_gbps": 1,
                      "peak_tflops": {"fp32": 2}})"),
      "g.json");
  EXPECT_EQ(gpu.ceilings(false).effective_format(PeakFormat::kINT8), PeakFormat::kFP32);
}

TEST(Hardware, OperatorEfficiencyByNameThenClass) {
  json j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "test", "operator_efficiency":
                                  {"gemm": 0.8, "routed_experts": 0.5}})");
  const HardwareSpec hw = parse_hardware(j, "t.json");
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kRoutedExperts, Phase::kDecode, false), 0.5);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kQkvProj, Phase::kDecode, false), 0.8);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kAttentionScores, Phase::kDecode, false), 1.0);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kRoutedExperts, Phase::kDecode, true), 1.0);
  // Without a prefill table, a prompt's step takes the same figures.
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kRoutedExperts, Phase::kPrefill, false), 0.5);
  EXPECT_DOUBLE_EQ(hw.efficiency_as(OperatorClass::kGemm, Phase::kDecode, false), 0.8);
  EXPECT_DOUBLE_EQ(hw.efficiency_as(OperatorClass::kAttention, Phase::kPrefill, false), 1.0);
}

// In a prompt's step the prefill table wins, by name then class, then the general table does;
// an operator run as another class's kernels takes that class's entries alone.
TEST(Hardware, PrefillEfficiencyBeforeTheGeneralTable) {
  json j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "test",
      "operator_efficiency": {"gemm": 0.8, "routed_experts": 0.5, "elementwise": 0.9},
      "prefill_operator_efficiency": {"attention": 0.2, "routed_experts": 0.3, "gemm": 0.7}})");
  const HardwareSpec hw = parse_hardware(j, "t.json");
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kAttentionScores, Phase::kPrefill, false), 0.2);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kAttentionScores, Phase::kDecode, false), 1.0);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kRoutedExperts, Phase::kPrefill, false), 0.3);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kRoutedExperts, Phase::kDecode, false), 0.5);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kQkvProj, Phase::kPrefill, false), 0.7);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kAttnNorm, Phase::kPrefill, false), 0.9);
  EXPECT_DOUBLE_EQ(hw.efficiency(OperatorKind::kAttentionScores, Phase::kPrefill, true), 1.0);
  EXPECT_DOUBLE_EQ(hw.efficiency_as(OperatorClass::kGemm, Phase::kPrefill, false), 0.7);
  EXPECT_DOUBLE_EQ(hw.efficiency_as(OperatorClass::kGemm, Phase::kDecode, false), 0.8);
  j["measured"]["prefill_operator_efficiency"] = json::parse(R"({"softmax": 0.5})");
  EXPECT_THROW(parse_hardware(j, "t.json"), Error);
}

TEST(Hardware, PerCallLatencyAddsToTheRooflineTime) {
  json j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "test", "operator_efficiency": {"gemm": 0.5},
                                  "operator_latency_us": {"gemm": 6, "router": 2}})");
  const HardwareSpec hw = parse_hardware(j, "t.json");
  EXPECT_DOUBLE_EQ(hw.latency(OperatorKind::kQkvProj, false), 6e-6);
  EXPECT_DOUBLE_EQ(hw.latency(OperatorKind::kRouter, false), 2e-6);
  EXPECT_DOUBLE_EQ(hw.latency(OperatorKind::kAttnNorm, false), 0.0);
  EXPECT_DOUBLE_EQ(hw.latency(OperatorKind::kQkvProj, true), 0.0);
}

TEST(Hardware, ErrorsQuoteOnlyAnExcerptOfTheValue) {
  json j = minimal_gpu();
  j["memory_gib"] = json::array({std::string(1 << 20, '9')});
  const std::string error = rejection(j);
  EXPECT_NE(error.find("'memory_gib' must be a positive number, got [\"999"), std::string::npos);
  EXPECT_LT(error.size(), 200u);
}

TEST(Hardware, AnOverlongNameIsAnErrorNotAnException) {
  // std::filesystem::exists threw for a name longer than the file system allows.
  EXPECT_THROW(find_hardware(std::string(5000, 'h')), Error);
}

TEST(Hardware, MalformedFilesAreRejectedNamingTheField) {
  json j = minimal_gpu();
  j.erase("memory_bandwidth_gbps");
  EXPECT_NE(rejection(j).find("missing field 'memory_bandwidth_gbps'"), std::string::npos);

  j = minimal_gpu();
  j["memory_bandwidth_gbps"] = -5;
  EXPECT_NE(rejection(j).find("'memory_bandwidth_gbps' must be a positive number, got -5"),
            std::string::npos);

  j = minimal_gpu();
  j["memory_gib"] = "80";
  EXPECT_NE(rejection(j).find("'memory_gib' must be a positive number"), std::string::npos);

  j = minimal_gpu();
  j["bandwidth"] = 5;  // a typo must not silently fall back
  EXPECT_NE(rejection(j).find("unknown field 'bandwidth'"), std::string::npos);

  j = minimal_gpu();
  j["kind"] = "tpu";
  EXPECT_NE(rejection(j).find("kind must be \"gpu\" or \"cpu\""), std::string::npos);

  j = minimal_gpu();
  j["peak_tflops"] = json::parse(R"({"bf16": 100})");
  EXPECT_NE(rejection(j).find("peak_tflops.fp32 is required"), std::string::npos);

  j = minimal_gpu();
  j["peak_tflops"]["fp16"] = 100;
  EXPECT_NE(rejection(j).find("unknown field 'fp16'"), std::string::npos);

  j = minimal_gpu();
  j["name"] = "my gpu";
  EXPECT_NE(rejection(j).find("name 'my gpu'"), std::string::npos);

  j = minimal_gpu();
  j["sm_count"] = 1.5;
  EXPECT_NE(rejection(j).find("'sm_count' must be a positive integer"), std::string::npos);

  j = minimal_gpu();
  j["measured"] = json::parse(R"({"read_bandwidth_gbps": 900, "copy_bandwidth_gbps": 1800,
                                  "method": "x"})");
  EXPECT_NE(rejection(j).find("below twice read_bandwidth_gbps"), std::string::npos);

  j = minimal_gpu();
  j["measured"] = json::parse(R"({"read_bandwidth_gbps": 900})");
  EXPECT_NE(rejection(j).find("missing field 'method'"), std::string::npos);

  j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "x", "operator_efficiency": {"moe": 0.5}})");
  EXPECT_NE(rejection(j).find("'moe' is neither an operator"), std::string::npos);

  j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "x", "operator_efficiency": {"gemm": 3}})");
  EXPECT_NE(rejection(j).find("'gemm' is 3; expected a number in"), std::string::npos);

  j = minimal_gpu();
  j["measured"] = json::parse(R"({"method": "x", "operator_latency_us": {"attention": -1}})");
  EXPECT_NE(rejection(j).find("'attention' is -1; expected a number in"), std::string::npos);

  EXPECT_NE(rejection(json::array()).find("expected a JSON object"), std::string::npos);
}

TEST(Hardware, FilesAreFoundByNameOrPath) {
  const auto dir = std::filesystem::temp_directory_path() / "ekva_roofline_hw_test";
  std::filesystem::create_directories(dir);
  const auto path = dir / "mine.json";
  {
    std::ofstream out(path);
    out << minimal_gpu().dump();
  }
  EXPECT_EQ(find_hardware(path.string()).name, "test-gpu");
  {
    std::ofstream out(path);
    out << "{not json";
  }
  try {
    find_hardware(path.string());
    ADD_FAILURE() << "accepted broken JSON";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find("mine.json"), std::string::npos);
  }
  try {
    find_hardware("no-such-gpu");
    ADD_FAILURE() << "found a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_NE(std::string(e.what()).find("h200"), std::string::npos);  // lists the known names
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ekva
