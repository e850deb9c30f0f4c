// Replays every input kept under tests/fixtures/fuzz-regressions/TARGET through what the libFuzzer
// target fuzz_TARGET does with it: each must load or fail with ekva::Error, nothing else.
#include <gtest/gtest.h>

#include <filesystem>

#include "../../fuzz/targets.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

TEST(FuzzRegressions, EveryKeptInputLoadsOrFailsWithAnEkvaError) {
  int replayed = 0;
  for (const auto& dir : fs::directory_iterator(fs::path(EKVA_FIXTURES) / "fuzz-regressions")) {
    const auto target = fuzz::targets().find(dir.path().filename().string());
    ASSERT_NE(target, fuzz::targets().end()) << "no fuzz target named " << dir.path();
    for (const auto& input : fs::directory_iterator(dir.path())) {
      SCOPED_TRACE(input.path().string());
      const std::string bytes = read_text_file(input.path());
      try {
        target->second(bytes);
      } catch (const Error&) {
      }
      ++replayed;
    }
  }
  fuzz::remove_input_files();
  EXPECT_GT(replayed, 0);
}

}  // namespace
}  // namespace ekva
