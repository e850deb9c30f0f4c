#pragma once
// Safetensors: memory-mapped reading with a fully validated header, sharded checkpoints through
// model.safetensors.index.json, and atomic writing (a failed write leaves no partial file).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace ekva {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;

  int64_t numel() const;
  std::string shape_string() const;  // "[2, 40]"
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws kNotFound naming the file and the tensor.
  const TensorView& get(const std::string& name) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The tensors of a model directory: model.safetensors, or the shards an index names.
class TensorStore {
 public:
  explicit TensorStore(const std::filesystem::path& model_dir);

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;
  // get() plus a check of the shape; the error names the tensor, the expected and the found shape.
  const TensorView& get(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Writes to a temporary name beside `path` and renames on success.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ekva
