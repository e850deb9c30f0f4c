#include "tokenizer/decoder.h"

#include <unordered_map>

#include "core/error.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace ekva {
namespace {

using tokenizer_json::optional_bool;
using tokenizer_json::optional_string;
using tokenizer_json::required;
using tokenizer_json::required_array;
using tokenizer_json::required_count;
using tokenizer_json::required_string;
using tokenizer_json::single_character;

class ByteLevelDecoder : public Decoder {
 public:
  ByteLevelDecoder() {
    const auto& alphabet = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) {
      size_t pos = 0;
      byte_of_.emplace(next_code_point(alphabet[b], pos), static_cast<unsigned char>(b));
    }
  }

  // A token with a character outside the byte alphabet (an added token such as a run of spaces)
  // contributes its own UTF-8 bytes.
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const size_t mark = bytes.size();
      size_t pos = 0;
      bool mapped = true;
      while (pos < token.size()) {
        const auto it = byte_of_.find(next_code_point(token, pos));
        if (it == byte_of_.end()) {
          mapped = false;
          break;
        }
        bytes += static_cast<char>(it->second);
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }

 private:
  std::unordered_map<char32_t, unsigned char> byte_of_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(const nlohmann::json& spec, const std::string& where)
      : replacement_(single_character(optional_string(spec, "replacement", "\xE2\x96\x81", where),
                                      where + ".replacement")) {
    const auto scheme = spec.find("prepend_scheme");
    if (scheme != spec.end() && !scheme->is_null()) {
      strip_first_ = required_string(spec, "prepend_scheme", where) != "never";
    } else {
      strip_first_ = optional_bool(spec, "add_prefix_space", true, where);
    }
  }

  // Hugging Face drops every replacement character of the first token when a prefix was added.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      size_t pos = 0;
      while (pos < tokens[i].size()) {
        const char32_t c = next_code_point(tokens[i], pos);
        if (c != replacement_) {
          append_utf8(out, c);
        } else if (i != 0 || !strip_first_) {
          out += ' ';
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_ = true;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(const nlohmann::json& spec, const std::string& where)
      : pattern_(required(spec, "pattern", where), where + ".pattern"),
        content_(required_string(spec, "content", where)) {}

  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) token = pattern_.replace(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  // Runs of <0xHH> tokens become their bytes when those form UTF-8, else one U+FFFD per byte.
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    size_t pending_count = 0;
    const auto flush = [&] {
      if (pending_count == 0) return;
      if (invalid_utf8_offset(pending) == std::string_view::npos) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (std::string& token : tokens) {
      if (const int byte = parse_byte_token(token); byte >= 0) {
        pending += static_cast<char>(byte);
        ++pending_count;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int parse_byte_token(const std::string& token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      const char c = token[i];
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }
};

class FuseDecoder : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string fused;
    for (const std::string& token : tokens) fused += token;
    tokens.assign(1, std::move(fused));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(const nlohmann::json& spec, const std::string& where)
      : content_(single_character(required_string(spec, "content", where), where + ".content")),
        start_(required_count(spec, "start", where)),
        stop_(required_count(spec, "stop", where)) {}

  // Removes up to `start` leading and `stop` trailing `content` characters from each token.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::vector<char32_t> chars;
      for (size_t pos = 0; pos < token.size();) chars.push_back(next_code_point(token, pos));
      size_t begin = 0;
      while (begin < start_ && begin < chars.size() && chars[begin] == content_) ++begin;
      size_t end = chars.size();
      for (size_t i = 0; i < stop_ && end > begin && chars[end - 1] == content_; ++i) --end;
      std::string out;
      for (size_t i = begin; i < end; ++i) append_utf8(out, chars[i]);
      token = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class SequenceDecoder : public Decoder {
 public:
  SequenceDecoder(const nlohmann::json& spec, const std::string& where) {
    const auto& items = required_array(spec, "decoders", where);
    for (size_t i = 0; i < items.size(); ++i) {
      parts_.push_back(make_decoder(items[i], fmt::format("{}.decoders[{}]", where, i)));
    }
  }

  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& part : parts_) part->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, const std::string& where) {
  const std::string type = required_string(spec, "type", where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return std::make_unique<MetaspaceDecoder>(spec, where);
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(spec, where);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") return std::make_unique<StripDecoder>(spec, where);
  if (type == "Sequence") return std::make_unique<SequenceDecoder>(spec, where);
  fail(ErrorKind::kUnsupported, "{}: decoder type '{}' is not supported", where, type);
}

}  // namespace ekva
