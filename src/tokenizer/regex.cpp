#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace ekva {

struct Regex::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
};

Regex::Regex(std::string_view pattern, std::string_view what) : compiled_(new Compiled) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (compiled_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    delete compiled_;
    fail(ErrorKind::kInvalidFile, "{}: regex '{}' does not compile at offset {}: {}", what, pattern,
         error_offset, reinterpret_cast<const char*>(message));
  }
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  pcre2_code_free(compiled_->code);
  delete compiled_;
}

void Regex::for_each_match(std::string_view text,
                           const std::function<void(size_t, size_t)>& on_match) const {
  // Match data is per call so that one Regex serves concurrent encodes.
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = compiled_->jit ? pcre2_jit_match(compiled_->code, subject, text.size(), pos, 0,
                                                    match, nullptr)
                                  : pcre2_match(compiled_->code, subject, text.size(), pos,
                                                PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(match);
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(ErrorKind::kInvalidArgument, "regex match failed at byte {} of {}: {}", pos, text.size(),
           reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t start = ovector[0], end = ovector[1];
    on_match(start, end);
    if (end > start) {
      pos = end;
    } else {
      if (end >= text.size()) break;
      pos = end + utf8_length(static_cast<unsigned char>(text[end]));
    }
  }
  pcre2_match_data_free(match);
}

Pattern::Pattern(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_object() && spec.contains("String")) {
    literal_ = tokenizer_json::required_string(spec, "String", where);
  } else if (spec.is_object() && spec.contains("Regex")) {
    regex_ = std::make_unique<Regex>(tokenizer_json::required_string(spec, "Regex", where), where);
  } else {
    fail(ErrorKind::kInvalidFile, "{}: expected {{\"String\": ...}} or {{\"Regex\": ...}}", where);
  }
}

void Pattern::for_each_match(std::string_view text,
                             const std::function<void(size_t, size_t)>& on_match) const {
  if (regex_) {
    regex_->for_each_match(text, on_match);
    return;
  }
  if (literal_.empty()) return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    on_match(pos, pos + literal_.size());
  }
}

std::string Pattern::replace(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  size_t copied = 0;
  for_each_match(text, [&](size_t start, size_t end) {
    out.append(text.substr(copied, start - copied));
    out.append(content);
    copied = end;
  });
  out.append(text.substr(copied));
  return out;
}

}  // namespace ekva
