#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "io/json_file.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> load_tokenizer_json(const fs::path& file,
                                               const SpecialTokenSettings& settings) {
  const nlohmann::json spec = read_json_file(file);
  try {
    return std::make_unique<HfTokenizer>(spec, file.string(), settings);
  } catch (const nlohmann::json::exception& e) {
    // A field of the wrong JSON type deep inside a component.
    fail(ErrorKind::kInvalidFile, "{}: malformed tokenizer: {}", file.string(), e.what());
  }
}

// tokenizer_config.json writes a special token as a string or as an AddedToken object.
std::optional<std::string> token_field(const nlohmann::json& config, const char* key,
                                       const fs::path& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  fail(ErrorKind::kInvalidFile, "{}: {}: expected a string or {{\"content\": ...}}", file.string(),
       key);
}

std::optional<bool> flag_field(const nlohmann::json& config, const char* key,
                               const fs::path& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    fail(ErrorKind::kInvalidFile, "{}: {}: expected true or false", file.string(), key);
  }
  return it->get<bool>();
}

}  // namespace

std::vector<int32_t> encode_prefix(const Tokenizer& tokenizer, std::string_view text,
                                   size_t max_tokens) {
  // Ids near a cut can differ from the whole text's (a pre-token or merge that would have
  // continued), so a prefix counts only once this many ids lie beyond the ones kept.
  constexpr size_t kMargin = 64;
  for (size_t bytes = std::max<size_t>(4096, (max_tokens + kMargin) * 8); bytes < text.size();
       bytes *= 2) {
    size_t cut = bytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
    std::vector<int32_t> ids = tokenizer.encode(text.substr(0, cut), false);
    if (ids.size() >= max_tokens + kMargin) {
      ids.resize(max_tokens);
      return ids;
    }
  }
  std::vector<int32_t> ids = tokenizer.encode(text, false);
  if (ids.size() > max_tokens) ids.resize(max_tokens);
  return ids;
}

SpecialTokenSettings read_special_token_settings(const fs::path& config_file) {
  const nlohmann::json config = read_json_file(config_file);
  if (!config.is_object()) {
    fail(ErrorKind::kInvalidFile, "{}: expected a JSON object", config_file.string());
  }
  SpecialTokenSettings s;
  s.add_bos = flag_field(config, "add_bos_token", config_file);
  s.add_eos = flag_field(config, "add_eos_token", config_file);
  s.bos_token = token_field(config, "bos_token", config_file);
  s.eos_token = token_field(config, "eos_token", config_file);
  return s;
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& file_or_dir) {
  if (!path_exists(file_or_dir))
    fail(ErrorKind::kNotFound, "{}: no such file", file_or_dir.string());
  std::error_code ec;
  if (fs::is_directory(file_or_dir, ec)) {
    SpecialTokenSettings settings;
    if (path_exists(file_or_dir / "tokenizer_config.json")) {
      settings = read_special_token_settings(file_or_dir / "tokenizer_config.json");
    }
    if (path_exists(file_or_dir / "tokenizer.json")) {
      return load_tokenizer_json(file_or_dir / "tokenizer.json", settings);
    }
    if (path_exists(file_or_dir / "tokenizer.model")) {
      return std::make_unique<SentencePieceTokenizer>(file_or_dir / "tokenizer.model", settings);
    }
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json or tokenizer.model", file_or_dir.string());
  }
  if (file_or_dir.extension() == ".json") return load_tokenizer_json(file_or_dir, {});
  return std::make_unique<SentencePieceTokenizer>(file_or_dir, SpecialTokenSettings{});
}

bool has_tokenizer(const fs::path& model_dir) {
  return path_exists(model_dir / "tokenizer.json") || path_exists(model_dir / "tokenizer.model");
}

}  // namespace ekva
