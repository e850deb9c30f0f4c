#pragma once
// Text in, ids out and back: tokenizer.json (BPE) and SentencePiece models behind one interface.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ekva {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // `text` must be valid UTF-8 (kInvalidArgument otherwise). `add_special` adds the BOS/EOS ids
  // that the tokenizer's post-processor or tokenizer_config.json asks for.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // kInvalidArgument for an id that no token has; `skip_special` leaves out special tokens.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special) const = 0;
  // One past the largest id.
  virtual int32_t vocab_size() const = 0;
};

// The first `max_tokens` ids of tokenizer.encode(text, false) without encoding all of a long
// text: growing prefixes are encoded until one gives a margin of ids beyond `max_tokens`.
std::vector<int32_t> encode_prefix(const Tokenizer& tokenizer, std::string_view text,
                                   size_t max_tokens);

// What tokenizer_config.json says about BOS/EOS; an absent field leaves the tokenizer's default.
struct SpecialTokenSettings {
  std::optional<bool> add_bos, add_eos;
  std::optional<std::string> bos_token, eos_token;
};

// Reads the BOS/EOS fields of a tokenizer_config.json.
SpecialTokenSettings read_special_token_settings(const std::filesystem::path& config_file);

// A tokenizer.json or SentencePiece .model file, or a model directory: there tokenizer.json is
// preferred over tokenizer.model, and tokenizer_config.json's add_bos_token/add_eos_token apply.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& file_or_dir);

// Whether load_tokenizer(model_dir) finds a tokenizer file there.
bool has_tokenizer(const std::filesystem::path& model_dir);

}  // namespace ekva
