// Invalid input and malformed tokenizer files give errors that say what and where.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "io/json_file.h"
#include "support/repo_paths.h"
#include "support/temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

// Runs `body`, which must throw ekva::Error of `kind` whose message contains `needle`.
template <typename Body>
void expect_error(Body body, ErrorKind kind, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

using testing::TempDir;

// The smallest well-formed byte-level tokenizer.json: 256 single-byte tokens, no merges.
nlohmann::json minimal_tokenizer() {
  static const nlohmann::json vocab = [] {
    nlohmann::json v = nlohmann::json::object();
    const nlohmann::json reference =
        read_json_file(testing::tokenizer_fixture("allenai_dolma2.json"));
    for (const auto& [token, id] : reference["model"]["vocab"].items()) {
      if (id.get<int>() < 256) v[token] = id;
    }
    return v;
  }();
  return {{"version", "1.0"},
          {"added_tokens", nlohmann::json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

fs::path write_json(const TempDir& dir, const nlohmann::json& j) {
  const fs::path path = dir.path() / "tokenizer.json";
  std::ofstream(path) << j.dump();
  return path;
}

TEST(TokenizerErrors, InvalidUtf8InputIsRejectedWithItsOffset) {
  const auto json_tokenizer = load_tokenizer(testing::tokenizer_fixture("allenai_dolma2.json"));
  const auto sp_tokenizer =
      load_tokenizer(testing::tokenizer_fixture("mistral-v3.tokenizer.model"));
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"\xFF", 0},                  // never valid
      {"abc\xE2\x82", 3},           // truncated
      {"ok \xC0\xAF", 3},           // overlong '/'
      {"x\xED\xA0\x80", 1},         // UTF-16 surrogate
      {"ab\xF4\x90\x80\x80", 2},    // above U+10FFFF
      {"caf\xC3\xA9 \x80 ok", 6}};  // stray continuation byte
  for (const auto& [text, offset] : bad) {
    for (const Tokenizer* t : {json_tokenizer.get(), sp_tokenizer.get()}) {
      expect_error([&] { t->encode(text, false); }, ErrorKind::kInvalidArgument,
                   "invalid UTF-8 at byte " + std::to_string(offset));
    }
  }
}

TEST(TokenizerErrors, UnknownIdsAreRejectedOnDecode) {
  for (const char* file : {"mistral-v3.tokenizer.json", "mistral-v3.tokenizer.model"}) {
    const auto t = load_tokenizer(testing::tokenizer_fixture(file));
    const std::vector<int32_t> ids = {1, t->vocab_size()};
    expect_error([&] { t->decode(ids, false); }, ErrorKind::kInvalidArgument,
                 "token id " + std::to_string(t->vocab_size()) + " at index 1");
    const std::vector<int32_t> negative = {-1};
    expect_error([&] { t->decode(negative, false); }, ErrorKind::kInvalidArgument, "token id -1");
  }
}

TEST(TokenizerErrors, MissingFilesAndDirectories) {
  TempDir dir;
  expect_error([&] { load_tokenizer(dir.path()); }, ErrorKind::kNotFound,
               "no tokenizer.json or tokenizer.model");
  expect_error([&] { load_tokenizer(dir.path() / "absent.json"); }, ErrorKind::kNotFound,
               "absent.json");
}

TEST(TokenizerErrors, NotJsonAndNotSentencePiece) {
  TempDir dir;
  std::ofstream(dir.path() / "tokenizer.json") << "{\"model\": ";
  expect_error([&] { load_tokenizer(dir.path() / "tokenizer.json"); }, ErrorKind::kInvalidFile,
               "not valid JSON");
  std::ofstream(dir.path() / "tokenizer.model") << "not a protobuf";
  expect_error([&] { load_tokenizer(dir.path() / "tokenizer.model"); }, ErrorKind::kInvalidFile,
               "not a SentencePiece model");
}

// SentencePiece reports most bad models as a status, but its trie library throws on some; that
// too is a bad file, named (this input, kept by fuzz_sentencepiece_model, aborted the target).
TEST(TokenizerErrors, SentencePieceExceptionsNameTheFile) {
  const fs::path file = fs::path(EKVA_FIXTURES) / "fuzz-regressions" / "sentencepiece_model" /
                        "darts_zero_length_key.model";
  expect_error([&] { load_tokenizer(file); }, ErrorKind::kInvalidFile,
               "darts_zero_length_key.model: not a SentencePiece model");
}

TEST(TokenizerErrors, MinimalTokenizerLoads) {
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, minimal_tokenizer()));
  EXPECT_EQ(t->decode(t->encode("byte level", false), false), "byte level");
}

// Each malformed variant of the minimal tokenizer and a phrase its error must contain.
struct Malformed {
  std::string name;
  std::function<void(nlohmann::json&)> edit;
  ErrorKind kind;
  std::string needle;
};

TEST(TokenizerErrors, MalformedComponentsAreNamed) {
  const std::vector<Malformed> cases = {
      {"no model", [](auto& j) { j.erase("model"); }, ErrorKind::kInvalidFile,
       "missing field 'model'"},
      {"unigram", [](auto& j) { j["model"]["type"] = "Unigram"; }, ErrorKind::kUnsupported,
       "'Unigram'"},
      {"normalizer",
       [](auto& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       ErrorKind::kUnsupported, "normalizer type 'Lowercase'"},
      {"nested normalizer",
       [](auto& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers", {{{"type", "NFC"}}, {{"type", "StripAccents"}}}}};
       },
       ErrorKind::kUnsupported, "normalizers[1]: normalizer type 'StripAccents'"},
      {"pre-tokenizer",
       [](auto& j) {
         j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
       },
       ErrorKind::kUnsupported, "pre-tokenizer type 'BertPreTokenizer'"},
      {"decoder",
       [](auto& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       ErrorKind::kUnsupported, "decoder type 'WordPiece'"},
      {"post-processor",
       [](auto& j) {
         j["post_processor"] = {{"type", "Custom"}};
       },
       ErrorKind::kUnsupported, "post-processor type 'Custom'"},
      {"regex",
       [](auto& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
       },
       ErrorKind::kInvalidFile, "regex '(unclosed' does not compile"},
      {"behavior",
       [](auto& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
       },
       ErrorKind::kUnsupported, "'Sideways' is not a split behavior"},
      {"merge token", [](auto& j) { j["model"]["merges"] = {"a zz"}; }, ErrorKind::kInvalidFile,
       "token 'zz' is not in the vocabulary"},
      {"merge result", [](auto& j) { j["model"]["merges"] = {"a b"}; }, ErrorKind::kInvalidFile,
       "merged token 'ab' is not in the vocabulary"},
      {"merge shape", [](auto& j) { j["model"]["merges"] = {"abc"}; }, ErrorKind::kInvalidFile,
       "merges[0]"},
      {"vocab id", [](auto& j) { j["model"]["vocab"]["a"] = "one"; }, ErrorKind::kInvalidFile,
       "vocab['a']"},
      {"unk", [](auto& j) { j["model"]["unk_token"] = "<unk>"; }, ErrorKind::kInvalidFile,
       "unk_token: '<unk>' is not in the vocabulary"},
      {"strip type",
       [](auto& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", "one"}, {"stop", 0}};
       },
       ErrorKind::kInvalidFile,
       "decoder.start: expected an integer in [0, 2147483647], got \"one\""},
      // A float is converted to a count only when it is one (1e30 as size_t is undefined).
      {"strip count",
       [](auto& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1e30}, {"stop", 0}};
       },
       ErrorKind::kInvalidFile, "decoder.start: expected an integer in [0, 2147483647], got"},
      {"added token",
       [](auto& j) {
         j["added_tokens"] = {{{"content", "<x>"}}};
       },
       ErrorKind::kInvalidFile, "added_tokens[0]: missing field 'id'"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    nlohmann::json j = minimal_tokenizer();
    c.edit(j);
    const fs::path path = write_json(dir, j);
    expect_error([&] { load_tokenizer(path); }, c.kind, c.needle);
    expect_error([&] { load_tokenizer(path); }, c.kind, path.string());
  }
}

TEST(TokenizerErrors, TokenizerConfigNamingAnUnknownToken) {
  TempDir dir;
  fs::copy_file(testing::tokenizer_fixture("mistral-v3.tokenizer.json"),
                dir.path() / "tokenizer.json");
  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"add_eos_token": true, "eos_token": "<nope>"})";
  expect_error([&] { load_tokenizer(dir.path()); }, ErrorKind::kInvalidFile,
               "eos_token '<nope>' is not a token");
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"add_bos_token": "yes"})";
  expect_error([&] { load_tokenizer(dir.path()); }, ErrorKind::kInvalidFile,
               "add_bos_token: expected true or false");
}

TEST(TokenizerErrors, TokenIdsAreBoundedBeforeTablesAreSized) {
  // An id of 2^31 - 1 sized a table of 2^31 entries (and overflowed computing it).
  for (const auto& edit : std::vector<std::function<void(nlohmann::json&)>>{
           [](auto& j) { j["model"]["vocab"]["a"] = 2147483647; },
           [](auto& j) {
             j["added_tokens"] = {{{"id", 2147483647}, {"content", "<x>"}}};
           },
           [](auto& j) {
             j["post_processor"] = {
                 {"type", "BertProcessing"}, {"cls", {"a", 4294967296}}, {"sep", {"a", 0}}};
           }}) {
    TempDir dir;
    nlohmann::json j = minimal_tokenizer();
    edit(j);
    expect_error([&] { load_tokenizer(write_json(dir, j)); }, ErrorKind::kInvalidFile,
                 "expected a token id in [0, 16777215]");
  }
}

TEST(TokenizerErrors, DeeplyNestedSequencesAreRefusedAtParse) {
  // A Sequence normalizer nested 20,000 deep took 3 GB; 40,000 overflowed the stack.
  std::string normalizer;
  for (int i = 0; i < 40000; ++i) normalizer += R"({"type": "Sequence", "normalizers": [)";
  TempDir dir;
  const fs::path path = dir.path() / "tokenizer.json";
  std::ofstream(path) << R"({"model": {}, "normalizer": )" << normalizer;
  expect_error([&] { load_tokenizer(path); }, ErrorKind::kInvalidFile,
               "JSON nested deeper than 64 levels");
}

TEST(TokenizerErrors, EncodePrefixKeepsTheIdsOfTheWholeText) {
  const auto tokenizer = load_tokenizer(testing::tokenizer_fixture("allenai_dolma2.json"));
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "Paragraph " + std::to_string(i) + ": some words here.\n";
  const std::vector<int32_t> all = tokenizer->encode(text, false);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{500}, all.size() - 10, all.size() + 10}) {
    const std::vector<int32_t> prefix = encode_prefix(*tokenizer, text, n);
    ASSERT_EQ(prefix.size(), std::min(n, all.size()));
    EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), all.begin())) << n;
  }
}

}  // namespace
}  // namespace ekva
