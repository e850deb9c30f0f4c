#pragma once
// A read-only memory map of a whole file; weights are used in place, never copied.
#include <cstddef>
#include <filesystem>

namespace ekva {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ekva
