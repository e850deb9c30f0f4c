// ekva calibrate -> ekva plan -> ekva generate --policy ekva --plan, end to end on the embedded
// model.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kv/budget_plan.h"
#include "support/repo_paths.h"
#include "support/run_ekva.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

TEST(CalibrateCli, StatsToPlanToGeneration) {
  const fs::path dir = fs::temp_directory_path() / ("ekva_calib_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string stats = (dir / "stats.json").string(), plan = (dir / "plan.json").string();
  testing::CommandResult r = testing::run_ekva(
      "calibrate --model " + testing::kEmbeddedModel + " --data " + testing::kRepoRoot.string() +
      "/data/calibration/heldout-calibration.txt --tokens 512 --chunk 256 --out " + stats +
      " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  r = testing::run_ekva("plan --stats " + stats +
                        " --budget 0.25 --allocator greedy --groups 4 --model " +
                        testing::kEmbeddedModel + " --out " + plan + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto summary = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_GT(summary["provenance"]["predicted_retained_mass"].get<double>(), 0.0);
  r = testing::run_ekva("generate --model " + testing::kEmbeddedModel +
                        " --prompt \"The kernel schedules tasks\" --max-new-tokens 4 "
                        "--policy ekva --kv-budget 0.5 --plan " +
                        plan + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  // A plan for another model is refused by name.
  r = testing::run_ekva("generate --model " + std::string(EKVA_FIXTURES) +
                        "/hf-tiny/tiny-mixtral --ids 1,2,3 "
                        "--policy ekva --plan " +
                        plan);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("budget plan"), std::string::npos) << r.out;
  // The surprisal reserve travels in the plan; --reserve-* on a command that runs it override it.
  EXPECT_EQ(BudgetPlan::load(plan).reserve.threshold, ReserveOptions{}.threshold);
  const std::string tuned = (dir / "tuned.json").string();
  r = testing::run_ekva("plan --stats " + stats +
                        " --budget 0.25 --reserve-threshold 2.5 --reserve-cap 0.1 "
                        "--reserve-span 1 --out " +
                        tuned);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(BudgetPlan::load(tuned).reserve.threshold, 2.5);
  EXPECT_EQ(BudgetPlan::load(tuned).reserve.cap, 0.1);
  EXPECT_EQ(BudgetPlan::load(tuned).reserve.span, 1);
  r = testing::run_ekva("generate --model " + testing::kEmbeddedModel +
                        " --ids 1,2,3 --max-new-tokens 1 --policy ekva --reserve-span=-1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--reserve-span"), std::string::npos) << r.out;
  r = testing::run_ekva("plan --stats " + stats + " --budget 0.25 --reserve-cap 1.5 --out " +
                        (dir / "bad.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--reserve-cap: 1.5"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "bad.json"));
  r = testing::run_ekva("generate --model " + testing::kEmbeddedModel +
                        " --ids 1,2,3 --max-new-tokens 1 --policy ekva --plan " + tuned +
                        " --reserve-cap 1.5");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cap 1.5"), std::string::npos) << r.out;
  r = testing::run_ekva("plan --stats " + stats + " --budget 0.1 --floor 0.05 --out " +
                        (dir / "x.json").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cannot be met"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "x.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ekva
