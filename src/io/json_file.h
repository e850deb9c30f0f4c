#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>

namespace ekva {

// Parses a JSON file; errors name the file and say what is wrong.
nlohmann::json read_json_file(const std::filesystem::path& path);

// Writes text to a temporary name beside `path` and renames on success.
void write_text_file(const std::filesystem::path& path, const std::string& text);

}  // namespace ekva
