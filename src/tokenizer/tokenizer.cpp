#include "tokenizer/tokenizer.h"

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
  if (fs::is_directory(file_or_dir)) {
    SpecialTokenSettings settings;
    if (fs::exists(file_or_dir / "tokenizer_config.json")) {
      settings = read_special_token_settings(file_or_dir / "tokenizer_config.json");
    }
    if (fs::exists(file_or_dir / "tokenizer.json")) {
      return load_tokenizer_json(file_or_dir / "tokenizer.json", settings);
    }
    if (fs::exists(file_or_dir / "tokenizer.model")) {
      return std::make_unique<SentencePieceTokenizer>(file_or_dir / "tokenizer.model", settings);
    }
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json or tokenizer.model", file_or_dir.string());
  }
  if (!fs::exists(file_or_dir))
    fail(ErrorKind::kNotFound, "{}: no such file", file_or_dir.string());
  if (file_or_dir.extension() == ".json") return load_tokenizer_json(file_or_dir, {});
  return std::make_unique<SentencePieceTokenizer>(file_or_dir, SpecialTokenSettings{});
}

bool has_tokenizer(const fs::path& model_dir) {
  return fs::exists(model_dir / "tokenizer.json") || fs::exists(model_dir / "tokenizer.model");
}

}  // namespace ekva
