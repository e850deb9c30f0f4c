#pragma once
// tokenizer.json pre-tokenizers: ByteLevel, Split, Metaspace, Digits and Sequence. They cut
// normalized text into the words that the model encodes one by one.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ekva {

struct PreToken {
  std::string text;
  // Whether the word begins where the input text begins (Metaspace's "first" prepend scheme).
  bool at_text_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `words` by their pre-tokenization; empty words are dropped.
  virtual void pre_tokenize(std::vector<PreToken>& words) const = 0;
  // When the last step maps bytes to byte-level characters, stops doing so and returns true: the
  // model then takes raw bytes and maps only the words it has not cached
  // (BpeModel::take_raw_bytes).
  virtual bool leave_byte_mapping_to_model() { return false; }
};

// `where` names the file and field for errors, which name any unsupported "type".
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& where);

// The 256 strings that byte-level BPE uses for the bytes 0..255 (GPT-2's printable mapping).
const std::vector<std::string>& byte_level_alphabet();

}  // namespace ekva
