#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace ekva {

nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kNotFound, "{}: cannot open", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidFile, "{}: not valid JSON: {}", path.string(), e.what());
  }
}

void write_text_file(const std::filesystem::path& path, const std::string& text) {
  write_file_atomically(path, [&](std::ostream& out) { out << text; });
}

}  // namespace ekva
