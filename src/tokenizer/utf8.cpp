#include "tokenizer/utf8.h"

#include <cstdint>
#include <cstring>

#include "core/error.h"

namespace ekva {
namespace {

// Length of the well-formed character at `pos`, or the length of the maximal ill-formed prefix
// there as a negative number (Unicode's "maximal subpart" rule, table 3-7).
int classify_utf8(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char second_low = 0x80, second_high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;
    if (lead == 0xED) second_high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;
    if (lead == 0xF4) second_high = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < length; ++i) {
    if (pos + i >= text.size()) return -i;
    const unsigned char b = byte(pos + i);
    const bool ok = i == 1 ? (b >= second_low && b <= second_high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -i;
  }
  return length;
}

}  // namespace

size_t invalid_utf8_offset(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs dominate real text; skip them eight bytes at a time.
    while (pos + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + pos, 8);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= text.size()) break;
    const int length = classify_utf8(text, pos);
    if (length < 0) return pos;
    pos += length;
  }
  return std::string_view::npos;
}

void require_valid_utf8(std::string_view text, std::string_view what) {
  const size_t pos = invalid_utf8_offset(text);
  if (pos != std::string_view::npos) {
    fail(ErrorKind::kInvalidArgument, "{}: invalid UTF-8 at byte {} (byte 0x{:02X})", what, pos,
         static_cast<unsigned char>(text[pos]));
  }
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  const size_t length = utf8_length(lead);
  char32_t cp = length == 1 ? lead : lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (byte(pos + i) & 0x3F);
  pos += length;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int length = classify_utf8(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      out += "\xEF\xBF\xBD";
      pos += -length;
    }
  }
  return out;
}

}  // namespace ekva
