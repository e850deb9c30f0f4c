#pragma once
// tokenizer.json decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ekva {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings; the decoded text is their concatenation at the end of the chain.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// `where` names the file and field for errors, which name any unsupported "type".
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where);

}  // namespace ekva
