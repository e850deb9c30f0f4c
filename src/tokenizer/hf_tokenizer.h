#pragma once
// A Hugging Face tokenizer.json with a BPE model: added tokens are matched first, then the
// normalizer, pre-tokenizer and model run on the text between them.
#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ekva {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Finds added tokens in text, leftmost first and longest among those that start there.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is what token `tokens[i]` looks like in the text it is matched against.
  AddedTokenMatcher(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns);

  struct Segment {
    size_t start, end;
    const AddedToken* token;  // nullptr for text between added tokens
  };
  // Cuts `text` into text and added-token segments; lstrip/rstrip widen a token's segment over
  // the whitespace beside it, single_word tokens match only between non-word characters.
  void split(std::string_view text, std::vector<Segment>& segments) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ where a pattern ends here
  };
  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;
  bool can_start_[256] = {};
};

class HfTokenizer : public Tokenizer {
 public:
  // `spec` is a parsed tokenizer.json; `where` names it for errors.
  HfTokenizer(const nlohmann::json& spec, const std::string& where,
              const SpecialTokenSettings& settings);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t vocab_size() const override;

 private:
  void encode_text(std::string text, bool at_text_start, std::vector<int32_t>& ids) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  void read_post_processor(const nlohmann::json& spec, const std::string& where);
  void apply_settings(const SpecialTokenSettings& settings, const std::string& where);

  BpeModel model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, const AddedToken*> added_by_id_;
  AddedTokenMatcher raw_matcher_;         // tokens with normalized = false, on the input text
  AddedTokenMatcher normalized_matcher_;  // tokens with normalized = true, on normalized text
  // Ids that add_special puts around the encoded text.
  std::vector<int32_t> prefix_ids_, suffix_ids_;
};

}  // namespace ekva
