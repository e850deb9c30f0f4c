#pragma once
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ekva {

// Runs `write` on a stream to a temporary name beside `path` and renames it into place once the
// stream is good, so a failed or interrupted write never leaves a partial file at `path`.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write);

// Writes every file of a result set into `dir` (created if missing), or none: all are written to
// temporary names first and renamed into place only once every one of them is complete.
void write_files_atomically(const std::filesystem::path& dir,
                            const std::vector<std::pair<std::string, std::string>>& name_and_text);

// Commands call these before their work, so that an output location that cannot be written fails
// at once, with the OS reason, rather than after minutes of work.
// A file can be created or replaced at `path`.
void check_output_file(const std::filesystem::path& path);
// Files can be written into `dir`, or into the directory that creating `dir` would make.
void check_output_directory(const std::filesystem::path& dir);

}  // namespace ekva
