#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <vector>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"

namespace ekva {
namespace {

using tokenizer_json::required_array;
using tokenizer_json::required_string;

bool is_ascii(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(const std::string& form, const std::string& where) {
    UErrorCode status = U_ZERO_ERROR;
    if (form == "NFC") {
      normalizer_ = icu::Normalizer2::getNFCInstance(status);
    } else if (form == "NFD") {
      normalizer_ = icu::Normalizer2::getNFDInstance(status);
    } else if (form == "NFKC") {
      normalizer_ = icu::Normalizer2::getNFKCInstance(status);
    } else {
      normalizer_ = icu::Normalizer2::getNFKDInstance(status);
    }
    if (U_FAILURE(status)) {
      fail(ErrorKind::kUnsupported, "{}: ICU has no {} normalizer: {}", where, form,
           u_errorName(status));
    }
  }

  std::string normalize(std::string text) const override {
    // ASCII is invariant under all four forms.
    if (is_ascii(text)) return text;
    UErrorCode status = U_ZERO_ERROR;
    if (normalizer_->isNormalizedUTF8(text, status) && U_SUCCESS(status)) return text;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    normalizer_->normalizeUTF8(0, text, sink, nullptr, status);
    if (U_FAILURE(status)) {
      fail(ErrorKind::kInvalidArgument, "Unicode normalization failed: {}", u_errorName(status));
    }
    return out;
  }

 private:
  const icu::Normalizer2* normalizer_ = nullptr;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(const nlohmann::json& spec, const std::string& where)
      : pattern_(tokenizer_json::required(spec, "pattern", where), where + ".pattern"),
        content_(required_string(spec, "content", where)) {}

  std::string normalize(std::string text) const override {
    return pattern_.replace(text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  PrependNormalizer(const nlohmann::json& spec, const std::string& where)
      : prefix_(required_string(spec, "prepend", where)) {}

  // Empty text stays empty, as in Hugging Face tokenizers.
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class SequenceNormalizer : public Normalizer {
 public:
  SequenceNormalizer(const nlohmann::json& spec, const std::string& where) {
    const auto& items = required_array(spec, "normalizers", where);
    for (size_t i = 0; i < items.size(); ++i) {
      parts_.push_back(make_normalizer(items[i], fmt::format("{}.normalizers[{}]", where, i)));
    }
  }

  std::string normalize(std::string text) const override {
    for (const auto& part : parts_) text = part->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& where) {
  const std::string type = required_string(spec, "type", where);
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(type, where);
  }
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(spec, where);
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(spec, where);
  if (type == "Sequence") return std::make_unique<SequenceNormalizer>(spec, where);
  fail(ErrorKind::kUnsupported, "{}: normalizer type '{}' is not supported", where, type);
}

}  // namespace ekva
