#include "io/repository.h"

#include "core/error.h"
#include "io/json_file.h"

namespace ekva {

namespace fs = std::filesystem;

fs::path repository_path(const std::string& path) {
  if (fs::path(path).is_absolute() || path_exists(path)) return path;
  const fs::path source_tree = fs::path(EKVA_DATA_DIR).parent_path();
  if (path_exists(source_tree / path)) return source_tree / path;
  fail(ErrorKind::kNotFound, "{} is neither under the current directory nor under {}", path,
       source_tree.string());
}

}  // namespace ekva
