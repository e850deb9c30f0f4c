#pragma once
// A compiled Unicode regular expression (PCRE2, UTF + Unicode properties, JIT when available) for
// the Split pre-tokenizer, the ByteLevel regex and Replace patterns of tokenizer.json.
#include <cstddef>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ekva {

class Regex {
 public:
  // `what` names the pattern's origin (file and field) in compile errors.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each non-overlapping match, left to right; after an empty
  // match the search resumes one character later. `text` must be valid UTF-8.
  void for_each_match(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;

 private:
  struct Compiled;
  Compiled* compiled_;
};

// A tokenizer.json "pattern" field: {"String": literal} or {"Regex": expression}.
class Pattern {
 public:
  Pattern(const nlohmann::json& spec, const std::string& where);

  // As Regex::for_each_match; an empty literal matches nowhere.
  void for_each_match(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;
  std::string replace(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

}  // namespace ekva
