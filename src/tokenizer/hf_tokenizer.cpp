#include "tokenizer/hf_tokenizer.h"

#include <unicode/uchar.h>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace ekva {
namespace {

using tokenizer_json::optional_bool;
using tokenizer_json::required;
using tokenizer_json::required_array;
using tokenizer_json::required_string;

// Unicode White_Space, which lstrip/rstrip remove (Rust's char::is_whitespace).
bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// A regex \w character: letters, marks, decimal digits, connector punctuation, joiners.
bool is_word_character(char32_t c) {
  const auto category = u_charType(static_cast<UChar32>(c));
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC) ||
         category == U_NON_SPACING_MARK || category == U_ENCLOSING_MARK ||
         category == U_COMBINING_SPACING_MARK || category == U_DECIMAL_DIGIT_NUMBER ||
         category == U_CONNECTOR_PUNCTUATION || c == 0x200C || c == 0x200D;
}

char32_t last_code_point(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                                     std::vector<std::string> patterns)
    : tokens_(std::move(tokens)), nodes_(1) {
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    can_start_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t child = -1;
      for (const auto& [b, n] : nodes_[node].children) {
        if (b == byte) child = n;
      }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = static_cast<int32_t>(t);
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& segments) const {
  segments.clear();
  size_t done = 0;  // end of the last segment emitted
  size_t pos = 0;
  while (pos < text.size()) {
    if (!can_start_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      int32_t child = -1;
      for (const auto& [b, n] : nodes_[node].children) {
        if (b == static_cast<unsigned char>(text[i])) child = n;
      }
      if (child < 0) break;
      node = child;
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = i + 1;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken* token = tokens_[found];
    size_t start = pos, end = found_end;
    if (token->single_word) {
      const bool word_before =
          start > 0 && is_word_character(last_code_point(text.substr(0, start)));
      size_t after = end;
      const bool word_after = end < text.size() && is_word_character(next_code_point(text, after));
      if (word_before || word_after) {
        pos = found_end;  // the scan resumes after a discarded match, as Aho-Corasick's does
        continue;
      }
    }
    if (token->lstrip) {
      while (start > done) {
        const char32_t c = last_code_point(text.substr(0, start));
        if (!is_whitespace(c)) break;
        size_t back = start - 1;
        while ((static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
        start = back;
      }
    }
    if (token->rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!is_whitespace(next_code_point(text, next))) break;
        end = next;
      }
    }
    if (start > done) segments.push_back({done, start, nullptr});
    segments.push_back({start, end, token});
    done = pos = end;
  }
  if (done < text.size()) segments.push_back({done, text.size(), nullptr});
}

HfTokenizer::HfTokenizer(const nlohmann::json& spec, const std::string& where,
                         const SpecialTokenSettings& settings)
    : model_(required(spec, "model", where), where + ": model") {
  const auto component = [&](const char* key) -> const nlohmann::json* {
    const auto it = spec.find(key);
    return it == spec.end() || it->is_null() ? nullptr : &*it;
  };
  if (const auto* n = component("normalizer")) {
    normalizer_ = make_normalizer(*n, where + ": normalizer");
  }
  if (const auto* p = component("pre_tokenizer")) {
    pre_tokenizer_ = make_pre_tokenizer(*p, where + ": pre_tokenizer");
  }
  if (pre_tokenizer_ && pre_tokenizer_->leave_byte_mapping_to_model()) model_.take_raw_bytes();
  if (const auto* d = component("decoder")) decoder_ = make_decoder(*d, where + ": decoder");

  if (const auto* added = component("added_tokens")) {
    if (!added->is_array())
      fail(ErrorKind::kInvalidFile, "{}: added_tokens: expected an array", where);
    added_tokens_.reserve(added->size());
    for (size_t i = 0; i < added->size(); ++i) {
      const auto& a = (*added)[i];
      const std::string at = fmt::format("{}: added_tokens[{}]", where, i);
      AddedToken token;
      token.id = tokenizer_json::token_id(required(a, "id", at), at + ".id");
      token.content = required_string(a, "content", at);
      require_valid_utf8(token.content, at + ".content");
      token.single_word = optional_bool(a, "single_word", false, at);
      token.lstrip = optional_bool(a, "lstrip", false, at);
      token.rstrip = optional_bool(a, "rstrip", false, at);
      token.normalized = optional_bool(a, "normalized", true, at);
      token.special = optional_bool(a, "special", false, at);
      added_tokens_.push_back(std::move(token));
    }
  }
  std::vector<const AddedToken*> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (const AddedToken& token : added_tokens_) {
    added_by_id_[token.id] = &token;
    if (token.normalized) {
      normalized.push_back(&token);
      // A normalized token is looked for in normalized text, so in its normalized form.
      normalized_patterns.push_back(normalizer_ ? normalizer_->normalize(token.content)
                                                : token.content);
    } else {
      raw.push_back(&token);
      raw_patterns.push_back(token.content);
    }
  }
  raw_matcher_ = AddedTokenMatcher(std::move(raw), std::move(raw_patterns));
  normalized_matcher_ = AddedTokenMatcher(std::move(normalized), std::move(normalized_patterns));

  if (const auto* p = component("post_processor")) {
    read_post_processor(*p, where + ": post_processor");
  }
  apply_settings(settings, where);
}

void HfTokenizer::read_post_processor(const nlohmann::json& spec, const std::string& where) {
  const std::string type = required_string(spec, "type", where);
  if (type == "ByteLevel") return;  // adjusts offsets only
  if (type == "Sequence") {
    const auto& items = required_array(spec, "processors", where);
    for (size_t i = 0; i < items.size(); ++i) {
      read_post_processor(items[i], fmt::format("{}.processors[{}]", where, i));
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const auto& special_tokens = required(spec, "special_tokens", where);
    bool after_sequence = false;
    const auto& single = required_array(spec, "single", where);
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string at = fmt::format("{}.single[{}]", where, i);
      if (single[i].contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      const std::string name = required_string(required(single[i], "SpecialToken", at), "id", at);
      const auto& entry = required(special_tokens, name.c_str(), where + ".special_tokens");
      const std::string ids_at = where + ".special_tokens." + name;
      for (const auto& id : required_array(entry, "ids", ids_at)) {
        (after_sequence ? suffix_ids_ : prefix_ids_)
            .push_back(tokenizer_json::token_id(id, ids_at));
      }
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    prefix_ids_.push_back(
        tokenizer_json::token_id(required(spec, "cls", where).at(1), where + ".cls"));
    suffix_ids_.push_back(
        tokenizer_json::token_id(required(spec, "sep", where).at(1), where + ".sep"));
    return;
  }
  fail(ErrorKind::kUnsupported, "{}: post-processor type '{}' is not supported", where, type);
}

void HfTokenizer::apply_settings(const SpecialTokenSettings& settings, const std::string& where) {
  const auto resolve = [&](const std::optional<std::string>& token, const char* field) {
    if (!token) {
      fail(ErrorKind::kInvalidFile, "{}: tokenizer_config.json asks for {} but names no {}", where,
           field, field);
    }
    const auto id = token_to_id(*token);
    if (!id) {
      fail(ErrorKind::kInvalidFile, "{}: tokenizer_config.json's {} '{}' is not a token", where,
           field, *token);
    }
    return *id;
  };
  if (settings.add_bos) {
    prefix_ids_.clear();
    if (*settings.add_bos) prefix_ids_.push_back(resolve(settings.bos_token, "bos_token"));
  }
  if (settings.add_eos) {
    suffix_ids_.clear();
    if (*settings.add_eos) suffix_ids_.push_back(resolve(settings.eos_token, "eos_token"));
  }
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& added : added_tokens_) {
    if (added.content == token) return added.id;
  }
  return model_.token_to_id(token);
}

int32_t HfTokenizer::vocab_size() const {
  int32_t size = model_.vocab_size();
  for (const AddedToken& token : added_tokens_) size = std::max(size, token.id + 1);
  return size;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special) const {
  require_valid_utf8(text, "text to encode");
  std::vector<int32_t> ids;
  if (add_special) ids = prefix_ids_;
  std::vector<AddedTokenMatcher::Segment> raw_segments, normalized_segments;
  raw_matcher_.split(text, raw_segments);
  for (const auto& raw : raw_segments) {
    if (raw.token) {
      ids.push_back(raw.token->id);
      continue;
    }
    std::string piece(text.substr(raw.start, raw.end - raw.start));
    if (normalizer_) piece = normalizer_->normalize(std::move(piece));
    normalized_matcher_.split(piece, normalized_segments);
    for (const auto& segment : normalized_segments) {
      if (segment.token) {
        ids.push_back(segment.token->id);
      } else {
        encode_text(piece.substr(segment.start, segment.end - segment.start),
                    raw.start == 0 && segment.start == 0, ids);
      }
    }
  }
  if (add_special) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

void HfTokenizer::encode_text(std::string text, bool at_text_start,
                              std::vector<int32_t>& ids) const {
  std::vector<PreToken> words;
  words.push_back({std::move(text), at_text_start});
  if (pre_tokenizer_) pre_tokenizer_->pre_tokenize(words);
  for (const PreToken& word : words) {
    if (!word.text.empty()) model_.encode_word(word.text, ids);
  }
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (const auto it = added_by_id_.find(ids[i]); it != added_by_id_.end()) {
      if (!(skip_special && it->second->special)) tokens.push_back(it->second->content);
      continue;
    }
    const std::string* token = model_.id_to_token(ids[i]);
    if (token == nullptr) {
      fail(ErrorKind::kInvalidArgument, "token id {} at index {} is not in the vocabulary [0, {})",
           ids[i], i, vocab_size());
    }
    tokens.push_back(*token);
  }
  if (!decoder_) return fmt::format("{}", fmt::join(tokens, " "));
  decoder_->decode_chain(tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace ekva
