// `ekva serve` and `ekva loadgen` as processes: a server that SIGINT or SIGTERM stops cleanly
// with a load generator's requests served first.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "support/repo_paths.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

// Runs a shell script and returns its stdout and stderr together.
std::string shell(const std::string& script) {
  FILE* pipe = ::popen(("(" + script + ") 2>&1").c_str(), "r");
  std::string out;
  std::array<char, 4096> buf{};
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  ::pclose(pipe);
  return out;
}

class ServeCli : public ::testing::TestWithParam<std::string> {};

TEST_P(ServeCli, StopsCleanlyOnTheSignal) {
  const testing::TempDir dir;
  const std::string log = (dir.path() / "serve.log").string();
  const std::string ekva = EKVA_BINARY;
  // The server picks a free port and names it on its first line; loadgen then runs against it.
  const std::string out = shell(
      ekva + " serve --model " + testing::kEmbeddedModel + " --port 0 --max-sequences 2 2> " + log +
      " & pid=$!; for i in $(seq 300); do grep -q 'on http' " + log +
      " && break; sleep 0.1; done; url=$(grep -o 'http://[0-9.:]*' " + log + "); " + ekva +
      " loadgen --url $url --requests 4 --concurrency 2 --prompt-tokens 16 --max-tokens 4 --json;" +
      " echo loadgen_exit=$?; kill -" + GetParam() + " $pid; wait $pid; echo serve_exit=$?; cat " +
      log);
  EXPECT_NE(out.find("\"completed\":4"), std::string::npos) << out;
  EXPECT_NE(out.find("loadgen_exit=0"), std::string::npos) << out;
  EXPECT_NE(out.find("serve_exit=0"), std::string::npos) << out;
  EXPECT_NE(out.find("stopping"), std::string::npos) << out;
  EXPECT_NE(out.find("stopped after 4 requests, 16 tokens generated"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Signals, ServeCli, ::testing::Values("INT", "TERM"));

TEST(ServeCliHelp, ListsTheOptions) {
  const std::string out = shell(std::string(EKVA_BINARY) + " serve --help");
  for (const char* option :
       {"--model", "--random-weights", "--host", "--port", "--kv-memory", "--max-sequences",
        "--prefill-chunk", "--prefill-first", "--policy", "--budget", "--plan", "--device"}) {
    EXPECT_NE(out.find(option), std::string::npos) << option;
  }
  const std::string loadgen = shell(std::string(EKVA_BINARY) + " loadgen --help");
  for (const char* option : {"--url", "--requests", "--concurrency", "--prompt-tokens",
                             "--max-tokens", "--seed", "--timeout", "--json"}) {
    EXPECT_NE(loadgen.find(option), std::string::npos) << option;
  }
}

// Random weights are made on a GPU: a server that would run on the CPU refuses them at once, before
// reading anything, naming the option.
TEST(ServeCliErrors, RandomWeightsOnTheCpuAreRefused) {
  const std::string config = std::string(EKVA_FIXTURES) + "/configs/mixtral-8x7b/config.json";
  const std::string out = shell(std::string(EKVA_BINARY) + " serve --model " + config +
                                " --random-weights 1 --device cpu --port 0; echo exit=$?");
  EXPECT_NE(out.find("--random-weights"), std::string::npos) << out;
  EXPECT_NE(out.find("GPU"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
  EXPECT_EQ(out.find("on http"), std::string::npos) << out;
  const std::string bad_seed = shell(std::string(EKVA_BINARY) + " serve --model " + config +
                                     " --random-weights x --device cpu; echo exit=$?");
  EXPECT_NE(bad_seed.find("--random-weights"), std::string::npos) << bad_seed;
  EXPECT_NE(bad_seed.find("exit=1"), std::string::npos) << bad_seed;
  // A configuration without --random-weights has no weights to serve: the error says what to give.
  const std::string no_weights =
      shell(std::string(EKVA_BINARY) + " serve --model " + config + " --device cpu; echo exit=$?");
  EXPECT_NE(no_weights.find("--random-weights SEED"), std::string::npos) << no_weights;
  EXPECT_NE(no_weights.find("exit=1"), std::string::npos) << no_weights;
}

TEST(ServeCliErrors, AnUnreachableServerIsAnErrorNotAHang) {
  const std::string out = shell(std::string(EKVA_BINARY) +
                                " loadgen --url http://127.0.0.1:1 --requests 1; echo exit=$?");
  EXPECT_NE(out.find("ekva: error"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
}

}  // namespace
}  // namespace ekva
