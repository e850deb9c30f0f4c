#include "eval/repository.h"

#include "core/error.h"
#include "core/mapped_file.h"

namespace ekva {

namespace fs = std::filesystem;

fs::path repository_path(const std::string& path) {
  if (fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path source_tree = fs::path(EKVA_DATA_DIR).parent_path();
  if (fs::exists(source_tree / path)) return source_tree / path;
  fail(ErrorKind::kNotFound, "{} is neither under the current directory nor under {}", path,
       source_tree.string());
}

std::string file_text(const fs::path& path) {
  const MappedFile file(path);
  if (file.size() == 0) return {};
  return {reinterpret_cast<const char*>(file.data()), file.size()};
}

}  // namespace ekva
