#include "io/atomic_file.h"

#include <fstream>

#include "core/error.h"

namespace ekva {

void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "{}: cannot open for writing", tmp.string());
    try {
      write(out);
    } catch (...) {
      out.close();
      std::filesystem::remove(tmp);
      throw;
    }
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
