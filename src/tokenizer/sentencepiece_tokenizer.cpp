#include "tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <exception>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace ekva {

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_file,
                                               const SpecialTokenSettings& settings)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  sentencepiece::util::Status status;
  try {
    status = processor_->Load(model_file.string());
  } catch (const std::exception& e) {
    // Not every bad model comes back as a status: the trie library inside SentencePiece throws
    // (darts_clone's "zero-length key", found by fuzz_sentencepiece_model).
    fail(ErrorKind::kInvalidFile, "{}: not a SentencePiece model: {}", model_file.string(),
         e.what());
  }
  if (!status.ok()) {
    fail(ErrorKind::kInvalidFile, "{}: not a SentencePiece model: {}", model_file.string(),
         status.ToString());
  }
  const auto special_id = [&](const std::optional<std::string>& piece, int fallback,
                              const char* field) {
    const int id = piece ? processor_->PieceToId(*piece) : fallback;
    if (id < 0 || (piece && processor_->IdToPiece(id) != *piece)) {
      fail(ErrorKind::kInvalidFile, "{}: the model has no {} token{}", model_file.string(), field,
           piece ? " '" + *piece + "'" : std::string());
    }
    return id;
  };
  if (settings.add_bos.value_or(true)) {
    prefix_ids_.push_back(special_id(settings.bos_token, processor_->bos_id(), "bos"));
  }
  if (settings.add_eos.value_or(false)) {
    suffix_ids_.push_back(special_id(settings.eos_token, processor_->eos_id(), "eos"));
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, bool add_special) const {
  require_valid_utf8(text, "text to encode");
  std::vector<int> pieces;
  const auto status = processor_->Encode(text, &pieces);
  if (!status.ok()) {
    fail(ErrorKind::kInvalidArgument, "SentencePiece cannot encode the text: {}",
         status.ToString());
  }
  std::vector<int32_t> ids;
  ids.reserve(pieces.size() + 2);
  if (add_special) ids = prefix_ids_;
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  if (add_special) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      fail(ErrorKind::kInvalidArgument, "token id {} at index {} is not in the vocabulary [0, {})",
           ids[i], i, vocab_size());
    }
    if (skip_special && processor_->IsControl(ids[i])) continue;
    pieces.push_back(ids[i]);
  }
  std::string text;
  const auto status = processor_->Decode(pieces, &text);
  if (!status.ok()) {
    fail(ErrorKind::kInvalidArgument, "SentencePiece cannot decode the ids: {}", status.ToString());
  }
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const {
  return processor_->GetPieceSize();
}

}  // namespace ekva
