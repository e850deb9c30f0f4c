#pragma once
// A SentencePiece .model file through libsentencepiece.
#include <filesystem>
#include <memory>

#include "tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ekva {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Without settings, add_special adds BOS (as SentencePiece-based models expect) and no EOS.
  SentencePieceTokenizer(const std::filesystem::path& model_file,
                         const SpecialTokenSettings& settings);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  int32_t vocab_size() const override;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
};

}  // namespace ekva
