#pragma once
// Field access for tokenizer.json components; every error names the file and the field path.
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/json_file.h"
#include "io/model_limits.h"
#include "tokenizer/utf8.h"

namespace ekva::tokenizer_json {

inline const nlohmann::json& required(const nlohmann::json& spec, const char* key,
                                      const std::string& where) {
  if (!spec.is_object()) fail(ErrorKind::kInvalidFile, "{}: expected a JSON object", where);
  const auto it = spec.find(key);
  if (it == spec.end()) fail(ErrorKind::kInvalidFile, "{}: missing field '{}'", where, key);
  return *it;
}

inline std::string required_string(const nlohmann::json& spec, const char* key,
                                   const std::string& where) {
  const auto& v = required(spec, key, where);
  if (!v.is_string()) fail(ErrorKind::kInvalidFile, "{}.{}: expected a string", where, key);
  return v.get<std::string>();
}

inline const nlohmann::json& required_array(const nlohmann::json& spec, const char* key,
                                            const std::string& where) {
  const auto& v = required(spec, key, where);
  if (!v.is_array()) fail(ErrorKind::kInvalidFile, "{}.{}: expected an array", where, key);
  return v;
}

// Token ids index tables sized by the largest id, so they are bounded like a model's vocabulary.
inline constexpr int64_t kMaxTokenId = model_limits::kVocab - 1;

inline int32_t token_id(const nlohmann::json& value, const std::string& where) {
  if (!json_integer_in(value, 0, kMaxTokenId)) {
    fail(ErrorKind::kInvalidFile, "{}: expected a token id in [0, {}]", where, kMaxTokenId);
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

// A count such as a number of characters to strip: an integer in [0, 2^31).
inline size_t required_count(const nlohmann::json& spec, const char* key,
                             const std::string& where) {
  const auto& v = required(spec, key, where);
  if (!json_integer_in(v, 0, INT32_MAX)) {
    fail(ErrorKind::kInvalidFile, "{}.{}: expected an integer in [0, {}], got {}", where, key,
         INT32_MAX, json_excerpt(v));
  }
  return static_cast<size_t>(v.get<int64_t>());
}

// An absent or null field gives `fallback`.
inline bool optional_bool(const nlohmann::json& spec, const char* key, bool fallback,
                          const std::string& where) {
  const auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(ErrorKind::kInvalidFile, "{}.{}: expected true or false", where, key);
  return it->get<bool>();
}

inline std::string optional_string(const nlohmann::json& spec, const char* key,
                                   const std::string& fallback, const std::string& where) {
  const auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(ErrorKind::kInvalidFile, "{}.{}: expected a string", where, key);
  return it->get<std::string>();
}

// The one character of a field such as Strip's "content" or Metaspace's "replacement".
inline char32_t single_character(const std::string& text, const std::string& where) {
  size_t pos = 0;
  const char32_t c = text.empty() ? 0 : next_code_point(text, pos);
  if (text.empty() || pos != text.size()) {
    fail(ErrorKind::kInvalidFile, "{}: expected one character, got '{}'", where, text);
  }
  return c;
}

}  // namespace ekva::tokenizer_json
