#pragma once
// tokenizer.json normalizers: NFC/NFD/NFKC/NFKD, Replace, Prepend and Sequence.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ekva {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8; so is the result.
  virtual std::string normalize(std::string text) const = 0;
};

// Builds the normalizer that a tokenizer.json "normalizer" object describes; `where` names the file
// and field for errors, which name any unsupported "type".
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where);

}  // namespace ekva
