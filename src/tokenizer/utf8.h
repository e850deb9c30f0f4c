#pragma once
// UTF-8 helpers shared by the tokenizer components. Text reaching them has been validated once, at
// the tokenizer's entry, so the iteration helpers trust their input.
#include <cstddef>
#include <string>
#include <string_view>

namespace ekva {

// Byte offset of the first malformed sequence, or std::string_view::npos for valid UTF-8.
size_t invalid_utf8_offset(std::string_view text);

// Throws kInvalidArgument naming `what` and the byte offset of the first malformed sequence
// (overlong forms, surrogates and code points above U+10FFFF are malformed too).
void require_valid_utf8(std::string_view text, std::string_view what);

// Length in bytes of the character whose first byte is `lead` (1 for a stray continuation byte).
inline size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the character at `pos` of valid UTF-8 and advances `pos` past it.
char32_t next_code_point(std::string_view text, size_t& pos);

void append_utf8(std::string& out, char32_t code_point);

// Bytes to text, replacing each maximal ill-formed subsequence by U+FFFD (as Rust's
// String::from_utf8_lossy and Python's errors="replace" do).
std::string utf8_lossy(std::string_view bytes);

}  // namespace ekva
