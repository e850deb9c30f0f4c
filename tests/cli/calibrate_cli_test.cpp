// ekva calibrate -> ekva plan -> ekva generate --policy ekva --plan, end to end on the embedded
// model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace ekva {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = fs::path(EKVA_FIXTURES).parent_path().parent_path().string();
const std::string kModel = kRoot + "/models/ekva-moe-8m";

std::pair<int, std::string> run(const std::string& args) {
  FILE* pipe = ::popen((std::string(EKVA_BINARY) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CalibrateCli, StatsToPlanToGeneration) {
  const fs::path dir = fs::temp_directory_path() / ("ekva_calib_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string stats = (dir / "stats.json").string(), plan = (dir / "plan.json").string();
  auto [code, out] =
      run("calibrate --model " + kModel + " --data " + kRoot +
          "/data/calibration/heldout-calibration.txt --tokens 512 --chunk 256 --out " + stats +
          " --json");
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) =
      run("plan --stats " + stats + " --budget 0.25 --allocator greedy --groups 4 --model " +
          kModel + " --out " + plan + " --json");
  ASSERT_EQ(code, 0) << out;
  const auto summary = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_GT(summary["provenance"]["predicted_retained_mass"].get<double>(), 0.0);
  std::tie(code, out) = run("generate --model " + kModel +
                            " --prompt \"The kernel schedules tasks\" --max-new-tokens 4 "
                            "--policy ekva --kv-budget 0.5 --plan " +
                            plan + " --json");
  ASSERT_EQ(code, 0) << out;
  // A plan for another model is refused by name.
  std::tie(code, out) = run("generate --model " + std::string(EKVA_FIXTURES) +
                            "/hf-tiny/tiny-mixtral --ids 1,2,3 "
                            "--policy ekva --plan " +
                            plan);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("budget plan"), std::string::npos) << out;
  std::tie(code, out) = run("plan --stats " + stats + " --budget 0.1 --floor 0.05 --out " +
                            (dir / "x.json").string());
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("cannot be met"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "x.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ekva
