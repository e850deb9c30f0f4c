// Behaviour the reference cases do not reach: added-token flags, Metaspace prepend schemes, the
// choice of tokenizer in a model directory and tokenizer_config.json's BOS/EOS flags. Expected ids
// come from the fixtures or from the same tokenizer encoding the pieces the rule says the text
// falls into.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/json_file.h"
#include "support/repo_paths.h"
#include "support/temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int32_t>;

using testing::TempDir;

Ids concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A character-level byte-level tokenizer (OLMoE's first 256 ids, no merges) plus `added`.
std::unique_ptr<Tokenizer> byte_tokenizer(const TempDir& dir, const nlohmann::json& added) {
  static const nlohmann::json vocab = [] {
    nlohmann::json v = nlohmann::json::object();
    const nlohmann::json reference =
        read_json_file(testing::tokenizer_fixture("allenai_dolma2.json"));
    for (const auto& [token, id] : reference["model"]["vocab"].items()) {
      if (id.get<int>() < 256) v[token] = id;
    }
    return v;
  }();
  const nlohmann::json j = {
      {"added_tokens", added},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  const fs::path path = dir.path() / "tokenizer.json";
  std::ofstream(path) << j.dump();
  return load_tokenizer(path);
}

nlohmann::json added_token(const std::string& content, bool lstrip, bool rstrip, bool single_word) {
  return {{"id", 500},        {"content", content},         {"lstrip", lstrip},
          {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", false},
          {"special", true}};
}

TEST(AddedTokens, MatchedBeforeTheModelWithoutStripping) {
  TempDir dir;
  const auto plain = byte_tokenizer(dir, nlohmann::json::array());
  const auto with =
      byte_tokenizer(dir, nlohmann::json::array({added_token("<x>", false, false, false)}));
  EXPECT_EQ(with->encode("a <x> b", false),
            concat({plain->encode("a ", false), {500}, plain->encode(" b", false)}));
  EXPECT_EQ(with->decode(with->encode("a <x> b", false), false), "a <x> b");
  EXPECT_EQ(with->decode(with->encode("a <x> b", false), true), "a  b");
}

TEST(AddedTokens, LstripAndRstripTakeTheWhitespaceBeside) {
  TempDir dir;
  const auto plain = byte_tokenizer(dir, nlohmann::json::array());
  const auto left =
      byte_tokenizer(dir, nlohmann::json::array({added_token("<x>", true, false, false)}));
  EXPECT_EQ(left->encode("a \t<x> b", false),
            concat({plain->encode("a", false), {500}, plain->encode(" b", false)}));
  const auto right =
      byte_tokenizer(dir, nlohmann::json::array({added_token("<x>", false, true, false)}));
  EXPECT_EQ(right->encode("a <x>\n b", false),
            concat({plain->encode("a ", false), {500}, plain->encode("b", false)}));
}

TEST(AddedTokens, SingleWordOnlyBetweenNonWordCharacters) {
  TempDir dir;
  const auto plain = byte_tokenizer(dir, nlohmann::json::array());
  const auto word =
      byte_tokenizer(dir, nlohmann::json::array({added_token("cat", false, false, true)}));
  EXPECT_EQ(word->encode("concatenate", false), plain->encode("concatenate", false));
  EXPECT_EQ(word->encode("a cat.", false),
            concat({plain->encode("a ", false), {500}, plain->encode(".", false)}));
}

TEST(AddedTokens, LongestMatchWins) {
  TempDir dir;
  nlohmann::json short_token = added_token("<a", false, false, false);
  short_token["id"] = 501;
  const auto t = byte_tokenizer(
      dir, nlohmann::json::array({short_token, added_token("<ab>", false, false, false)}));
  EXPECT_EQ(t->encode("<ab><a", false), (Ids{500, 501}));
}

// Metaspace: a "▁" goes before the text always, only at the very start, or never.
TEST(Metaspace, PrependSchemes) {
  TempDir dir;
  nlohmann::json j = read_json_file(testing::tokenizer_fixture("mistral-v3.tokenizer.json"));
  j["post_processor"] = nullptr;
  const auto load = [&](const std::string& scheme) {
    j["pre_tokenizer"]["prepend_scheme"] = scheme;
    std::ofstream(dir.path() / "tokenizer.json") << j.dump();
    return load_tokenizer(dir.path() / "tokenizer.json");
  };
  const auto first = load("first");
  const auto always = load("always");
  const auto never = load("never");
  // The fixture's case: "Hello world" is "▁Hello" "▁world"; " Hello world" gets no second ▁.
  EXPECT_EQ(first->encode("Hello world", false), (Ids{23325, 2294}));
  EXPECT_EQ(always->encode("Hello world", false), (Ids{23325, 2294}));
  EXPECT_EQ(always->encode(" Hello world", false), (Ids{23325, 2294}));
  const Ids world = first->encode("world", false);  // "▁world"
  const Ids hello_bare = never->encode("Hello", false);
  EXPECT_NE(hello_bare, first->encode("Hello", false));
  EXPECT_EQ(never->encode("Hello world", false), concat({hello_bare, world}));
  // After an added token the text does not begin the input: only "always" prepends there.
  EXPECT_EQ(first->encode("<s>world", false), concat({{1}, never->encode("world", false)}));
  EXPECT_EQ(always->encode("<s>world", false), concat({{1}, world}));
}

// Bytes that do not form UTF-8 decode to U+FFFD: one per byte for ByteFallback (Mistral), one per
// maximal ill-formed sequence for ByteLevel (dolma2), as Hugging Face's decoders do.
TEST(Decode, InvalidBytesBecomeReplacementCharacters) {
  const std::string replacement = "\xEF\xBF\xBD";
  const nlohmann::json mistral =
      read_json_file(testing::tokenizer_fixture("mistral-v3.tokenizer.json"));
  const auto byte_token = [&](const char* name) {
    return mistral["model"]["vocab"][name].get<int32_t>();
  };
  const auto m = load_tokenizer(testing::tokenizer_fixture("mistral-v3.tokenizer.json"));
  const Ids euro = {byte_token("<0xE2>"), byte_token("<0x82>"), byte_token("<0xAC>")};
  EXPECT_EQ(m->decode(euro, false), "\xE2\x82\xAC");
  const Ids cut = {byte_token("<0xE2>"), byte_token("<0x82>")};
  EXPECT_EQ(m->decode(cut, false), replacement + replacement);

  const nlohmann::json dolma = read_json_file(testing::tokenizer_fixture("allenai_dolma2.json"));
  const auto d = load_tokenizer(testing::tokenizer_fixture("allenai_dolma2.json"));
  // U+00E2 and U+0124 are the byte-level alphabet's characters for the bytes 0xE2 and 0x82.
  const Ids lone = {dolma["model"]["vocab"]["\xC3\xA2"].get<int32_t>(),
                    dolma["model"]["vocab"]["\xC4\xA4"].get<int32_t>()};
  EXPECT_EQ(d->decode(lone, false), replacement);
}

// Split behaviours on dolma2's merges: each behaviour's words, encoded one by one by the same
// tokenizer without any split, give the ids.
TEST(Split, DelimiterBehaviours) {
  TempDir dir;
  nlohmann::json j = read_json_file(testing::tokenizer_fixture("allenai_dolma2.json"));
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const auto load = [&](const nlohmann::json& pre_tokenizer) {
    j["pre_tokenizer"] = pre_tokenizer;
    std::ofstream(dir.path() / "tokenizer.json") << j.dump();
    return load_tokenizer(dir.path() / "tokenizer.json");
  };
  const auto whole = load(byte_level);
  const auto words = [&](std::initializer_list<std::string> parts) {
    Ids ids;
    for (const std::string& p : parts) {
      const Ids w = whole->encode(p, false);
      ids.insert(ids.end(), w.begin(), w.end());
    }
    return ids;
  };
  const auto split = [&](const std::string& behavior, bool invert) {
    return load({{"type", "Sequence"},
                 {"pretokenizers",
                  {{{"type", "Split"},
                    {"pattern", {{"String", ", "}}},
                    {"behavior", behavior},
                    {"invert", invert}},
                   byte_level}}});
  };
  const std::string text = "red, green, , blue";
  EXPECT_EQ(split("Removed", false)->encode(text, false), words({"red", "green", "blue"}));
  EXPECT_EQ(split("Isolated", false)->encode(text, false),
            words({"red", ", ", "green", ", ", ", ", "blue"}));
  EXPECT_EQ(split("MergedWithPrevious", false)->encode(text, false),
            words({"red, ", "green, ", ", ", "blue"}));
  EXPECT_EQ(split("MergedWithNext", false)->encode(text, false),
            words({"red", ", green", ", ", ", blue"}));
  EXPECT_EQ(split("Contiguous", false)->encode(text, false),
            words({"red", ", ", "green", ", , ", "blue"}));
  EXPECT_EQ(split("Removed", true)->encode(text, false), words({", ", ", ", ", "}));
  // Digits keeps runs of digits apart; individual_digits splits them one by one.
  const auto digits = [&](bool individual) {
    return load(
        {{"type", "Sequence"},
         {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", individual}}, byte_level}}});
  };
  EXPECT_EQ(digits(false)->encode("abc12345x", false), words({"abc", "12345", "x"}));
  EXPECT_EQ(digits(true)->encode("abc123x", false), words({"abc", "1", "2", "3", "x"}));
}

TEST(ModelDirectory, PrefersTokenizerJsonAndAppliesTokenizerConfig) {
  TempDir dir;
  // The fixtures: " Hello world" is [23325, 2294] for tokenizer.json and [29473, 23325, 2294]
  // for the SentencePiece model.
  fs::copy_file(testing::tokenizer_fixture("mistral-v3.tokenizer.model"),
                dir.path() / "tokenizer.model");
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", false), (Ids{29473, 23325, 2294}));
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", true), (Ids{1, 29473, 23325, 2294}));
  fs::copy_file(testing::tokenizer_fixture("mistral-v3.tokenizer.json"),
                dir.path() / "tokenizer.json");
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", false), (Ids{23325, 2294}));
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", true), (Ids{1, 23325, 2294}));

  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"add_bos_token": false, "add_eos_token": true, "bos_token": "<s>",
             "eos_token": {"content": "</s>", "special": true}})";
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", true), (Ids{23325, 2294, 2}));
  fs::remove(dir.path() / "tokenizer.json");
  EXPECT_EQ(load_tokenizer(dir.path())->encode(" Hello world", true), (Ids{29473, 23325, 2294, 2}));
}

}  // namespace
}  // namespace ekva
