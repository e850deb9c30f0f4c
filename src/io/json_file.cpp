#include "io/json_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

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
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "{}: cannot open for writing", tmp.string());
    out << text;
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(tmp);
      fail(ErrorKind::kIo, "{}: write failed", tmp.string());
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    fail(ErrorKind::kIo, "{}: cannot rename into place: {}", path.string(), ec.message());
  }
}

}  // namespace ekva
