#pragma once
#include <filesystem>
#include <functional>
#include <ostream>

namespace ekva {

// Runs `write` on a stream to a temporary name beside `path` and renames it into place once the
// stream is good, so a failed or interrupted write never leaves a partial file at `path`.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write);

}  // namespace ekva
