#include "io/json_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/atomic_file.h"

namespace ekva {
namespace {

std::string shorten(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  return std::string(text.substr(0, max_chars)) + "...";
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& source) {
  const auto bound_depth = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                       event == nlohmann::json::parse_event_t::array_start;
    if (opens && depth >= kMaxJsonDepth) {
      fail(ErrorKind::kInvalidFile, "{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), bound_depth);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's messages end by quoting the last token read, which can be a whole string literal
    // of the input; its own text before that is under 150 characters.
    fail(ErrorKind::kInvalidFile, "{}: not valid JSON: {}", source, shorten(e.what(), 200));
  }
}

bool path_exists(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    fail(ErrorKind::kIo, "{}: {}", path.string(), ec.message());
  }
  return std::filesystem::exists(status);
}

std::string read_text_file(const std::filesystem::path& path) {
  // A directory opens as a stream and then reads as empty, which would be misreported.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail(ErrorKind::kInvalidArgument, "{}: is a directory, not a file", path.string());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    fail(errno == ENOENT ? ErrorKind::kNotFound : ErrorKind::kIo, "{}: cannot open: {}",
         path.string(), std::strerror(errno));
  }
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) fail(ErrorKind::kIo, "{}: cannot read: {}", path.string(), std::strerror(errno));
  return text;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  return parse_json(read_text_file(path), path.string());
}

bool json_integer_in(const nlohmann::json& value, int64_t min, int64_t max) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    return max >= 0 && u <= static_cast<uint64_t>(max) && static_cast<int64_t>(u) >= min;
  }
  return value.is_number_integer() && value.get<int64_t>() >= min && value.get<int64_t>() <= max;
}

std::string json_excerpt(const nlohmann::json& value) {
  return shorten(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 48);
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

}  // namespace ekva
