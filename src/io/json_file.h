#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ekva {

// The deepest nesting accepted in user JSON. Real configs, tokenizers, plans and statistics nest
// fewer than 10 levels; the bound keeps the recursive copies, dumps and comparisons that follow a
// parse from overflowing the stack.
inline constexpr int kMaxJsonDepth = 64;

// Parses user-supplied JSON text; `source` names it in errors (a file, "stdin", a header).
// Nesting deeper than kMaxJsonDepth is refused while parsing, and error messages quote at most a
// short excerpt of the input.
nlohmann::json parse_json(std::string_view text, const std::string& source);

// Whether `path` exists. An OS error other than "no such file" (a symlink loop, a name too long,
// a directory that cannot be searched) is reported, naming the path, rather than taken for absence.
bool path_exists(const std::filesystem::path& path);

// The whole content of a file; errors name the file and give the OS reason (a directory is
// refused).
std::string read_text_file(const std::filesystem::path& path);

// read_text_file, then parse_json.
nlohmann::json read_json_file(const std::filesystem::path& path);

// Whether `value` is a JSON integer in [min, max]. A float never passes (converting one out of
// range is undefined), and neither does an unsigned integer above 2^63 (the library keeps every
// non-negative integer as unsigned, which would read as a negative int64).
bool json_integer_in(const nlohmann::json& value, int64_t min, int64_t max);

// A short, printable form of a user JSON value for error messages: its dump, cut to a few dozen
// characters.
std::string json_excerpt(const nlohmann::json& value);

// Writes text to a temporary name beside `path` and renames on success.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace ekva
