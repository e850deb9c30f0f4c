// The ekva binary end to end: interfaces other work relies on, and clear failures on bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/run_ekva.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;

CommandResult ekva(const std::string& args) {
  return testing::run_ekva(args);
}

const std::string kTinyMixtral = std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-mixtral";

class Cli : public ::testing::Test {
 protected:
  // A copy of tiny-mixtral whose model.safetensors is cut to `keep` bytes.
  fs::path truncated_model(size_t keep) {
    const fs::path d = dir_ / "model";
    fs::create_directories(d);
    fs::copy_file(kTinyMixtral + "/config.json", d / "config.json");
    std::ifstream in(kTinyMixtral + "/model.safetensors", std::ios::binary);
    std::string bytes(keep, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(keep));
    std::ofstream(d / "model.safetensors", std::ios::binary) << bytes;
    return d;
  }
  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(Cli, HelpOnEveryCommand) {
  for (const char* c : {"", "info", "forward", "generate"}) {
    const CommandResult r = ekva(std::string(c) + " --help");
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << c;
  }
}

TEST_F(Cli, InfoJson) {
  const CommandResult r = ekva("info --model " + kTinyMixtral + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "mixtral");
  // 3 layers x 2 KV heads x 16 head_dim x (K+V) x 4 bytes: the engine stores float32 K/V
  EXPECT_EQ(j["kv_dtype"], "F32");
  EXPECT_EQ(j["kv_bytes_per_token"], 3 * 2 * 16 * 2 * 4);
  const auto bf16 =
      nlohmann::json::parse(ekva("info --model " + kTinyMixtral + " --kv-dtype bf16 --json").out);
  EXPECT_EQ(bf16["kv_bytes_per_token"], 3 * 2 * 16 * 2 * 2);
  EXPECT_GT(j["parameters_total"].get<int64_t>(), j["parameters_active_per_token"].get<int64_t>());
}

TEST_F(Cli, ForwardWritesReferenceLayout) {
  const fs::path out = dir_ / "out.safetensors";
  const std::string ref = kTinyMixtral + "/reference.safetensors";
  const CommandResult r =
      ekva("forward --model " + kTinyMixtral + " --input " + ref + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  SafetensorsFile got(out), want(ref);
  for (const char* name : {"logits", "router_logits.0", "router_logits.2"}) {
    const TensorView& g = got.get(name);
    const TensorView& w = want.get(name);
    ASSERT_EQ(g.shape, w.shape) << name;
    float err = 0, scale = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      err = std::max(err, std::fabs(static_cast<const float*>(g.data)[i] -
                                    static_cast<const float*>(w.data)[i]));
      scale = std::max(scale, std::fabs(static_cast<const float*>(w.data)[i]));
    }
    EXPECT_LE(err, 1e-3f * scale) << name;
  }
}

TEST_F(Cli, GenerateJsonStopsAtMaxTokens) {
  const CommandResult r =
      ekva("generate --model " + kTinyMixtral + " --ids 5,6,7 --max-new-tokens 5 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_LE(j["tokens"].size(), 5u);
  EXPECT_GT(j["stats"]["kv_bytes"].get<int64_t>(), 0);
}

TEST_F(Cli, SeededSamplingIsReproducible) {
  const std::string args =
      "generate --model " + kTinyMixtral +
      " --ids 5,6,7 --max-new-tokens 8 --temperature 1.0 --top-k 20 --top-p 0.9 --seed 11 --json";
  const CommandResult a = ekva(args), b = ekva(args);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["tokens"], nlohmann::json::parse(b.out)["tokens"]);
}

// bench draws its decode tokens as generate does; bad values fail before the device is needed.
TEST_F(Cli, BenchTakesGeneratesSamplingOptions) {
  const CommandResult help = ekva("bench --help");
  ASSERT_EQ(help.code, 0);
  for (const char* option : {"--temperature", "--top-k", "--top-p", "--seed"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option;
  }
  const CommandResult r = ekva("bench --model " + kTinyMixtral + " --temperature -1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("temperature"), std::string::npos) << r.out;
}

TEST_F(Cli, TruncatedCheckpointFailsClearly) {
  const CommandResult r = ekva("info --model " + truncated_model(5000).string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
}

TEST_F(Cli, MissingTensorFailsClearly) {
  const fs::path d = dir_ / "model";
  fs::create_directories(d);
  fs::copy_file(kTinyMixtral + "/config.json", d / "config.json");
  const std::vector<float> one = {1.0f};
  write_safetensors(d / "model.safetensors", {{"model.norm.weight", DType::kF32, {1}, one.data()}});
  const CommandResult r = ekva("info --model " + d.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("model.embed_tokens.weight"), std::string::npos) << r.out;
}

TEST_F(Cli, MisShapedTensorFailsClearly) {
  const fs::path d = dir_ / "model";
  fs::create_directories(d);
  fs::copy_file(kTinyMixtral + "/config.json", d / "config.json");
  SafetensorsFile src(kTinyMixtral + "/model.safetensors");
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : src.tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (name == "model.layers.1.self_attn.k_proj.weight") shape = {shape[1], shape[0]};
    tensors.push_back({name, t.dtype, shape, t.data});
  }
  write_safetensors(d / "model.safetensors", tensors);
  const CommandResult r = ekva("info --model " + d.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("model.layers.1.self_attn.k_proj.weight"), std::string::npos) << r.out;
}

TEST_F(Cli, UnsupportedArchitectureFailsClearly) {
  const fs::path d = dir_ / "model";
  fs::create_directories(d);
  std::ifstream in(kTinyMixtral + "/config.json");
  auto j = nlohmann::json::parse(in);
  j["model_type"] = "deepseek_v3";
  std::ofstream(d / "config.json") << j.dump();
  const CommandResult r = ekva("info --model " + d.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("deepseek_v3"), std::string::npos) << r.out;
}

TEST_F(Cli, TokenOutOfRangeFailsWithoutPartialOutput) {
  const std::vector<int64_t> ids = {1, 2, 999};
  write_safetensors(dir_ / "in.safetensors", {{"input_ids", DType::kI64, {1, 3}, ids.data()}});
  const fs::path out = dir_ / "out.safetensors";
  const CommandResult r = ekva("forward --model " + kTinyMixtral + " --input " +
                               (dir_ / "in.safetensors").string() + " --out " + out.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("999"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(ekva("generate --model " + kTinyMixtral + " --ids 1,211").code, 1);
}

TEST_F(Cli, PromptLongerThanContextFails) {
  std::string ids = "1";
  for (int i = 1; i < 513; ++i) ids += ",1";  // tiny-mixtral's context is 512
  const CommandResult r = ekva("generate --model " + kTinyMixtral + " --ids " + ids);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("context"), std::string::npos) << r.out;
}

TEST_F(Cli, WrongInputDtypeFails) {
  const std::vector<float> ids = {1.0f, 2.0f};
  write_safetensors(dir_ / "in.safetensors", {{"input_ids", DType::kF32, {1, 2}, ids.data()}});
  const CommandResult r =
      ekva("forward --model " + kTinyMixtral + " --input " + (dir_ / "in.safetensors").string() +
           " --out " + (dir_ / "o.safetensors").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("int64"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ekva
