#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ekva {
namespace {

using tokenizer_json::optional_bool;
using tokenizer_json::optional_string;
using tokenizer_json::required;
using tokenizer_json::required_array;
using tokenizer_json::required_string;
using tokenizer_json::single_character;

// GPT-2's word regex, which ByteLevel applies when use_regex is true.
constexpr const char* kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// What happens to the matched delimiters when a word is split (Hugging Face's
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail(ErrorKind::kUnsupported, "{}.behavior: '{}' is not a split behavior", where, name);
}

struct Span {
  size_t start, end;
  bool is_match;
};

// Cuts `text` at the matches of `pattern` (flipped when `invert`) and arranges the delimiters as
// `behavior` says; the result's spans are the words to keep.
std::vector<Span> split_spans(std::string_view text, const Pattern& pattern, bool invert,
                              SplitBehavior behavior) {
  std::vector<Span> spans;
  size_t previous = 0;
  pattern.for_each_match(text, [&](size_t start, size_t end) {
    if (start != previous) spans.push_back({previous, start, invert});
    spans.push_back({start, end, !invert});
    previous = end;
  });
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});

  std::vector<Span> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.push_back(s);
      }
      return out;
    case SplitBehavior::kIsolated:
      return spans;
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty()) {
          out.back().end = s.end;
        } else {
          out.push_back(s);
        }
        previous_match = s.is_match;
      }
      return out;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      return out;
    }
  }
  return out;
}

void split_words(std::vector<PreToken>& words, const Pattern& pattern, bool invert,
                 SplitBehavior behavior) {
  std::vector<PreToken> out;
  out.reserve(words.size());
  for (const PreToken& word : words) {
    for (const Span& s : split_spans(word.text, pattern, invert, behavior)) {
      if (s.end == s.start) continue;
      out.push_back(
          {word.text.substr(s.start, s.end - s.start), word.at_text_start && s.start == 0});
    }
  }
  words = std::move(out);
}

nlohmann::json regex_spec(const char* expression) {
  return {{"Regex", expression}};
}

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(const nlohmann::json& spec, const std::string& where)
      : add_prefix_space_(optional_bool(spec, "add_prefix_space", true, where)) {
    if (optional_bool(spec, "use_regex", true, where)) {
      regex_ = std::make_unique<Pattern>(regex_spec(kByteLevelRegex), where);
    }
  }

  void pre_tokenize(std::vector<PreToken>& words) const override {
    if (add_prefix_space_) {
      for (PreToken& word : words) {
        if (!word.text.empty() && word.text[0] != ' ') word.text.insert(0, 1, ' ');
      }
    }
    if (regex_) split_words(words, *regex_, false, SplitBehavior::kIsolated);
    if (!map_bytes_) return;
    const auto& alphabet = byte_level_alphabet();
    for (PreToken& word : words) {
      std::string mapped;
      mapped.reserve(word.text.size() * 2);
      for (const char c : word.text) mapped += alphabet[static_cast<unsigned char>(c)];
      word.text = std::move(mapped);
    }
  }

  bool leave_byte_mapping_to_model() override {
    map_bytes_ = false;
    return true;
  }

 private:
  bool add_prefix_space_;
  bool map_bytes_ = true;
  std::unique_ptr<Pattern> regex_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(const nlohmann::json& spec, const std::string& where)
      : pattern_(required(spec, "pattern", where), where + ".pattern"),
        invert_(optional_bool(spec, "invert", false, where)),
        behavior_(parse_behavior(required_string(spec, "behavior", where), where)) {}

  void pre_tokenize(std::vector<PreToken>& words) const override {
    split_words(words, pattern_, invert_, behavior_);
  }

 private:
  Pattern pattern_;
  bool invert_;
  SplitBehavior behavior_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };

  MetaspacePreTokenizer(const nlohmann::json& spec, const std::string& where)
      : replacement_(optional_string(spec, "replacement", "\xE2\x96\x81", where)),
        split_(optional_bool(spec, "split", true, where)),
        split_pattern_(nlohmann::json{{"String", replacement_}}, where) {
    single_character(replacement_, where + ".replacement");
    const auto scheme = spec.find("prepend_scheme");
    if (scheme != spec.end() && !scheme->is_null()) {
      const std::string name = required_string(spec, "prepend_scheme", where);
      if (name == "always") {
        prepend_ = Prepend::kAlways;
      } else if (name == "first") {
        prepend_ = Prepend::kFirst;
      } else if (name == "never") {
        prepend_ = Prepend::kNever;
      } else {
        fail(ErrorKind::kUnsupported, "{}.prepend_scheme: '{}' is not always, first or never",
             where, name);
      }
    } else {
      // Files written before prepend_scheme existed say add_prefix_space instead.
      prepend_ =
          optional_bool(spec, "add_prefix_space", true, where) ? Prepend::kAlways : Prepend::kNever;
    }
  }

  void pre_tokenize(std::vector<PreToken>& words) const override {
    for (PreToken& word : words) {
      std::string replaced;
      replaced.reserve(word.text.size() + 8);
      for (const char c : word.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts_with_replacement = replaced.starts_with(replacement_);
      if (!starts_with_replacement &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && word.at_text_start))) {
        replaced.insert(0, replacement_);
      }
      word.text = std::move(replaced);
    }
    if (split_) split_words(words, split_pattern_, false, SplitBehavior::kMergedWithNext);
  }

 private:
  std::string replacement_;
  bool split_;
  Pattern split_pattern_;
  Prepend prepend_ = Prepend::kAlways;
};

class DigitsPreTokenizer : public PreTokenizer {
 public:
  DigitsPreTokenizer(const nlohmann::json& spec, const std::string& where)
      : digits_(regex_spec(optional_bool(spec, "individual_digits", false, where) ? R"(\p{N})"
                                                                                  : R"(\p{N}+)"),
                where) {}

  void pre_tokenize(std::vector<PreToken>& words) const override {
    split_words(words, digits_, false, SplitBehavior::kIsolated);
  }

 private:
  Pattern digits_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  SequencePreTokenizer(const nlohmann::json& spec, const std::string& where) {
    const auto& items = required_array(spec, "pretokenizers", where);
    for (size_t i = 0; i < items.size(); ++i) {
      parts_.push_back(make_pre_tokenizer(items[i], fmt::format("{}.pretokenizers[{}]", where, i)));
    }
  }

  void pre_tokenize(std::vector<PreToken>& words) const override {
    for (const auto& part : parts_) part->pre_tokenize(words);
  }

  bool leave_byte_mapping_to_model() override {
    return !parts_.empty() && parts_.back()->leave_byte_mapping_to_model();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

const std::vector<std::string>& byte_level_alphabet() {
  static const std::vector<std::string> alphabet = [] {
    // Printable Latin-1 bytes stand for themselves; the rest map to U+0100 upwards in byte order.
    std::vector<std::string> table(256);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      append_utf8(table[b], printable ? static_cast<char32_t>(b) : next++);
    }
    return table;
  }();
  return alphabet;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& where) {
  const std::string type = required_string(spec, "type", where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelPreTokenizer>(spec, where);
  if (type == "Split") return std::make_unique<SplitPreTokenizer>(spec, where);
  if (type == "Metaspace") return std::make_unique<MetaspacePreTokenizer>(spec, where);
  if (type == "Digits") return std::make_unique<DigitsPreTokenizer>(spec, where);
  if (type == "Sequence") return std::make_unique<SequencePreTokenizer>(spec, where);
  fail(ErrorKind::kUnsupported, "{}: pre-tokenizer type '{}' is not supported", where, type);
}

}  // namespace ekva
