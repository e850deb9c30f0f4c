#include "io/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace ekva {
namespace {

namespace fs = std::filesystem;

fs::path temporary_name(const fs::path& path) {
  return fs::path(path.string() + ".tmp");
}

// Writes `tmp` completely or throws, leaving nothing behind; errors name `path`, the file the
// user asked for.
void write_temporary(const fs::path& path, const fs::path& tmp,
                     const std::function<void(std::ostream&)>& write) {
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) {
    fail(ErrorKind::kIo, "{}: cannot write (temporary {}): {}", path.string(), tmp.string(),
         std::strerror(errno));
  }
  try {
    write(out);
  } catch (...) {
    out.close();
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  out.flush();
  if (!out) {
    const int e = errno;
    out.close();
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(ErrorKind::kIo, "{}: write failed: {}", path.string(), std::strerror(e));
  }
}

void rename_into_place(const fs::path& tmp, const fs::path& path) {
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    fail(ErrorKind::kIo, "{}: cannot rename into place: {}", path.string(), ec.message());
  }
}

// Fails unless `dir` is an existing directory this process may create files in.
void check_writable_directory(const fs::path& dir, const fs::path& output) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail(ErrorKind::kIo, "{}: cannot write: {} is not a directory{}", output.string(), dir.string(),
         ec ? ": " + ec.message() : "");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    fail(ErrorKind::kIo, "{}: cannot write into {}: {}", output.string(), dir.string(),
         std::strerror(errno));
  }
  // Permission bits do not tell everything (root passes access() where /proc or a read-only mount
  // still refuse files), so a file is made and removed there.
  std::string probe = (dir / ".ekva-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    fail(ErrorKind::kIo, "{}: cannot write into {}: {}", output.string(), dir.string(),
         std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

fs::path directory_of(const fs::path& path) {
  return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

}  // namespace

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  const fs::path tmp = temporary_name(path);
  write_temporary(path, tmp, write);
  rename_into_place(tmp, path);
}

void write_files_atomically(const fs::path& dir,
                            const std::vector<std::pair<std::string, std::string>>& name_and_text) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot create directory: {}", dir.string(), ec.message());
  std::vector<fs::path> written;
  try {
    for (const auto& file : name_and_text) {
      const fs::path path = dir / file.first;
      // A directory in the way would fail its rename after others had been renamed.
      if (fs::is_directory(path, ec)) {
        fail(ErrorKind::kIo, "{}: cannot write: it is a directory", path.string());
      }
      write_temporary(path, temporary_name(path), [&](std::ostream& out) { out << file.second; });
      written.push_back(path);
    }
  } catch (...) {
    for (const fs::path& path : written) fs::remove(temporary_name(path), ec);
    throw;
  }
  // Renames of files within one directory fail only if the directory changes under us.
  for (const fs::path& path : written) rename_into_place(temporary_name(path), path);
}

void check_output_file(const fs::path& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    fail(ErrorKind::kIo, "{}: cannot write: {}", path.string(), ec.message());
  }
  if (fs::is_directory(status)) {
    fail(ErrorKind::kIo, "{}: cannot write: it is a directory", path.string());
  }
  check_writable_directory(directory_of(path), path);
  if (fs::exists(status) && ::access(path.c_str(), W_OK) != 0) {
    fail(ErrorKind::kIo, "{}: cannot write: {}", path.string(), std::strerror(errno));
  }
}

void check_output_directory(const fs::path& dir) {
  // The nearest part of `dir` that exists is where writing (or creating the rest) starts.
  fs::path existing = dir;
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_relative_path() && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  if (existing.empty()) existing = ".";
  check_writable_directory(existing, dir);
}

}  // namespace ekva
