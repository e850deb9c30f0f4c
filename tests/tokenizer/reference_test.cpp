// Parity with the reference libraries: every case of tests/fixtures/tokenizers gives the ids of
// Hugging Face tokenizers 0.23.2 (with and without special tokens) and its decoding, and the
// SentencePiece model gives the ids of sentencepiece 0.2.2.
#include <gtest/gtest.h>

#include <map>

#include "io/json_file.h"
#include "tokenizer/tokenizer.h"

namespace ekva {
namespace {

std::string fixture(const std::string& name) {
  return std::string(EKVA_FIXTURES) + "/tokenizers/" + name;
}

const Tokenizer& cached_tokenizer(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[file];
  if (!slot) slot = load_tokenizer(fixture(file));
  return *slot;
}

struct Case {
  std::string tokenizer, text;
  std::vector<int32_t> ids, ids_with_special;
  std::string decoded;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.tokenizer << ": " << c.text;
}

std::vector<Case> hf_cases() {
  std::vector<Case> cases;
  const nlohmann::json file = read_json_file(fixture("tokenizer_cases.json"));
  for (const auto& c : file["cases"]) {
    cases.push_back({c["tokenizer"], c["text"], c["ids"], c["ids_with_special"], c["decoded"]});
  }
  return cases;
}

std::vector<Case> sentencepiece_cases() {
  std::vector<Case> cases;
  const nlohmann::json file = read_json_file(fixture("sentencepiece_cases.json"));
  for (const auto& c : file["cases"]) {
    cases.push_back({"mistral-v3.tokenizer.model", c["text"], c["ids"], {}, {}});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.tokenizer.substr(0, info.param.tokenizer.find('.'));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name + "_" + std::to_string(info.index);
}

class HfReference : public ::testing::TestWithParam<Case> {};

TEST_P(HfReference, IdsAndDecodingMatch) {
  const Case& c = GetParam();
  const Tokenizer& tokenizer = cached_tokenizer(c.tokenizer);
  EXPECT_EQ(tokenizer.encode(c.text, false), c.ids) << c.text;
  EXPECT_EQ(tokenizer.encode(c.text, true), c.ids_with_special) << c.text;
  EXPECT_EQ(tokenizer.decode(c.ids, false), c.decoded) << c.text;
}

// Our encode then our decode gives what Hugging Face's encode then decode gives (the text itself,
// up to NFC and Metaspace's stripped leading space); the BOS/EOS that add_special adds are exactly
// what skip_special removes.
TEST_P(HfReference, RoundTrip) {
  const Case& c = GetParam();
  const Tokenizer& tokenizer = cached_tokenizer(c.tokenizer);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(c.text, false), false), c.decoded);
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(c.text, true), true),
            tokenizer.decode(tokenizer.encode(c.text, false), true));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfReference, ::testing::ValuesIn(hf_cases()), case_name);

class SentencePieceReference : public ::testing::TestWithParam<Case> {};

TEST_P(SentencePieceReference, IdsMatch) {
  const Case& c = GetParam();
  const Tokenizer& tokenizer = cached_tokenizer(c.tokenizer);
  EXPECT_EQ(tokenizer.encode(c.text, false), c.ids) << c.text;
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), c.ids.begin(), c.ids.end());
  EXPECT_EQ(tokenizer.encode(c.text, true), with_bos) << c.text;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SentencePieceReference,
                         ::testing::ValuesIn(sentencepiece_cases()), case_name);

}  // namespace
}  // namespace ekva
