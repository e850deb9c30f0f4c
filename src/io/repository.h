#pragma once
// Files that ship in the repository (the embedded model, calibration and evaluation text), found
// from the current directory or from the source tree the library was built from.
#include <filesystem>
#include <string>

namespace ekva {

// `path` itself when absolute or present under the current directory, else under the source tree
// (EKVA_DATA_DIR's parent); throws kNotFound naming both places.
std::filesystem::path repository_path(const std::string& path);

}  // namespace ekva
