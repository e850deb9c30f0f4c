// `ekva tokenize`, `ekva detokenize` and `ekva generate --prompt` end to end, against the
// reference ids of tests/fixtures/tokenizers.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/json_file.h"
#include "support/temp_dir.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

const fs::path kTokenizers = fs::path(EKVA_FIXTURES) / "tokenizers";
const fs::path kMixtral = fs::path(EKVA_FIXTURES) / "hf-tiny/tiny-mixtral";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct CommandResult {
  int code;
  std::string out, err;
};

class TokenizerCli : public ::testing::Test {
 protected:
  // Runs ekva with `input` on stdin; stdout and stderr apart.
  CommandResult ekva(const std::string& args, const std::string& input) {
    std::ofstream(dir_ / "stdin", std::ios::binary) << input;
    const std::string cmd = std::string(EKVA_BINARY) + " " + args + " < " +
                            (dir_ / "stdin").string() + " > " + (dir_ / "stdout").string() +
                            " 2> " + (dir_ / "stderr").string();
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(dir_ / "stdout"),
            read_file(dir_ / "stderr")};
  }

  testing::TempDir temp_;
  const std::filesystem::path& dir_ = temp_.path();
};

TEST_F(TokenizerCli, TokenizeAndDetokenizeMatchTheReference) {
  const nlohmann::json cases = read_json_file(kTokenizers / "tokenizer_cases.json")["cases"];
  int checked = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    // The text with special-token strings; each run loads a tokenizer, so one text per file.
    if (text.find("<s> special") == std::string::npos) continue;
    SCOPED_TRACE(c["tokenizer"].get<std::string>() + ": " + text);
    const std::string tokenizer = "--tokenizer " + (kTokenizers / c["tokenizer"]).string();
    CommandResult r = ekva("tokenize --json " + tokenizer, text);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), c["ids"]);
    r = ekva("tokenize --json --add-special " + tokenizer, text);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), c["ids_with_special"]);
    r = ekva("detokenize " + tokenizer, c["ids"].dump());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, c["decoded"].get<std::string>());
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST_F(TokenizerCli, SentencePieceModel) {
  const nlohmann::json cases = read_json_file(kTokenizers / "sentencepiece_cases.json")["cases"];
  const nlohmann::json& c = cases[3];
  const std::string tokenizer =
      "--tokenizer " + (kTokenizers / "mistral-v3.tokenizer.model").string();
  const CommandResult r = ekva("tokenize --json " + tokenizer, c["text"]);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), c["ids"]);
  EXPECT_EQ(ekva("detokenize " + tokenizer, c["ids"].dump()).out, c["text"].get<std::string>());
}

TEST_F(TokenizerCli, BadInputFailsClearly) {
  const std::string tokenizer =
      "--tokenizer " + (kTokenizers / "mistral-v3.tokenizer.json").string();
  CommandResult r = ekva("tokenize " + tokenizer, "ok \xC3\x28");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("invalid UTF-8 at byte 3"), std::string::npos) << r.err;
  r = ekva("detokenize " + tokenizer, "[1, 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  r = ekva("detokenize " + tokenizer, "[1, \"two\"]");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("element 1 (\"two\") is not a token id"), std::string::npos) << r.err;
  r = ekva("detokenize " + tokenizer, std::string(300000, '['));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("stdin: JSON nested deeper than 64 levels"), std::string::npos) << r.err;
  r = ekva("detokenize " + tokenizer, "[1, [\"" + std::string(100000, 'x') + "\"]]");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("element 1 ([\"xxx"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 300u);
  r = ekva("detokenize " + tokenizer, "[1, 100000000]");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("token id 100000000 at index 1"), std::string::npos) << r.err;
}

// tiny-mixtral (vocabulary 211) with a byte-level tokenizer of 256 single-byte tokens.
TEST_F(TokenizerCli, GeneratePromptUsesTheModelDirectorysTokenizer) {
  const fs::path model = dir_ / "model";
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(kMixtral / f, model / f);
  }
  const CommandResult no_tokenizer =
      ekva("generate --model " + model.string() + " --prompt hello --max-new-tokens 2", "");
  EXPECT_EQ(no_tokenizer.code, 1);
  EXPECT_NE(no_tokenizer.err.find("no tokenizer.json or tokenizer.model"), std::string::npos)
      << no_tokenizer.err;

  nlohmann::json vocab = nlohmann::json::object();
  const nlohmann::json reference = read_json_file(kTokenizers / "allenai_dolma2.json");
  for (const auto& [token, id] : reference["model"]["vocab"].items()) {
    if (id.get<int>() < 256) vocab[token] = id;
  }
  std::ofstream(model / "tokenizer.json")
      << nlohmann::json{{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                        {"decoder", {{"type", "ByteLevel"}}},
                        {"model",
                         {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}
             .dump();

  const std::string prompt =
      "Hi(";  // its byte tokens' ids are below 211, tiny-mixtral's vocabulary
  const CommandResult ids = ekva("tokenize --add-special --tokenizer " + model.string(), prompt);
  ASSERT_EQ(ids.code, 0) << ids.err;
  const std::string id_list = ids.out.substr(0, ids.out.find('\n'));
  const CommandResult by_ids = ekva(
      "generate --json --max-new-tokens 6 --model " + model.string() + " --ids " + id_list, "");
  const CommandResult by_prompt = ekva(
      "generate --json --max-new-tokens 6 --model " + model.string() + " --prompt '" + prompt + "'",
      "");
  ASSERT_EQ(by_ids.code, 0) << by_ids.err;
  ASSERT_EQ(by_prompt.code, 0) << by_prompt.err;
  const auto a = nlohmann::json::parse(by_ids.out), b = nlohmann::json::parse(by_prompt.out);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(b["stats"]["prompt_tokens"], 3);
  const CommandResult text =
      ekva("detokenize --skip-special --tokenizer " + model.string(), b["tokens"].dump());
  EXPECT_EQ(b["text"], text.out);
}

}  // namespace
}  // namespace ekva
