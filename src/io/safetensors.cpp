#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"

namespace ekva {
namespace {

using nlohmann::json;

// Headers of real checkpoints are a few MB at most; a larger length means a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

DType parse_dtype(const std::string& s, const std::string& file, const std::string& tensor) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "I64") return DType::kI64;
  if (s == "I32") return DType::kI32;
  fail(ErrorKind::kUnsupported,
       "{}: tensor '{}' has dtype '{}' (supported: F32, BF16, F16, I64, I32)", file, tensor, s);
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path) : file_(path) {
  const std::string f = path.string();
  const size_t size = file_.size();
  if (size < 8) fail(ErrorKind::kInvalidFile, "{}: truncated: {} bytes, no header length", f, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    fail(ErrorKind::kInvalidFile, "{}: header length {} runs past the end of the file ({} bytes)",
         f, header_len, size);
  }
  const json header = parse_json(
      std::string_view(reinterpret_cast<const char*>(file_.data()) + 8, header_len), f + " header");
  if (!header.is_object()) fail(ErrorKind::kInvalidFile, "{}: header is not a JSON object", f);

  const unsigned char* base = file_.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(ErrorKind::kInvalidFile, "{}: __metadata__ is not an object", f);
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          fail(ErrorKind::kInvalidFile, "{}: __metadata__ value '{}' is not a string", f, k);
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' lacks dtype, shape or data_offsets", f, name);
    }
    if (!entry["dtype"].is_string()) {
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' dtype is not a string", f, name);
    }
    TensorView t;
    t.name = name;
    t.dtype = parse_dtype(entry["dtype"].get<std::string>(), f, name);
    const json& shape = entry["shape"];
    if (!shape.is_array())
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' shape is not a list", f, name);
    uint64_t numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has a negative or non-integer dimension", f,
             name);
      }
      t.shape.push_back(d.get<int64_t>());
      const uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t{1} << 62) / dim) {
        fail(ErrorKind::kInvalidFile, "{}: tensor '{}' shape overflows", f, name);
      }
      numel *= dim;
    }
    const json& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' data_offsets is not two non-negative integers",
           f, name);
    }
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(ErrorKind::kInvalidFile,
           "{}: tensor '{}' data_offsets [{}, {}] out of range (data section is {} bytes)", f, name,
           begin, end, data_size);
    }
    // numel is below 2^62, so numel x dtype size can wrap around 2^64: compare by division.
    const uint64_t element_bytes = dtype_size(t.dtype);
    if ((end - begin) % element_bytes != 0 || (end - begin) / element_bytes != numel) {
      fail(ErrorKind::kInvalidFile, "{}: tensor '{}' has {} bytes but shape {} of {} needs {}", f,
           name, end - begin, t.shape_string(), dtype_name(t.dtype),
           numel > UINT64_MAX / element_bytes ? "2^64 or more"
                                              : std::to_string(numel * element_bytes));
    }
    t.data = base + begin;
    t.bytes = end - begin;
    ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      fail(ErrorKind::kInvalidFile, "{}: tensor data ranges overlap at byte offset {}", f,
           ranges[i].first);
    }
  }
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    fail(ErrorKind::kNotFound, "{}: missing tensor '{}'", path().string(), name);
  }
  return it->second;
}

TensorStore::TensorStore(const std::filesystem::path& model_dir) {
  const auto index = model_dir / "model.safetensors.index.json";
  const auto single = model_dir / "model.safetensors";
  if (path_exists(index)) {
    const json j = read_json_file(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail(ErrorKind::kInvalidFile, "{}: no weight_map object", index.string());
    }
    std::map<std::string, const SafetensorsFile*> shards;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      if (!shard.is_string()) {
        fail(ErrorKind::kInvalidFile, "{}: weight_map['{}'] is not a file name", index.string(),
             tensor);
      }
      const std::string shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos) {
        fail(ErrorKind::kInvalidFile, "{}: shard name '{}' is not a plain file name",
             index.string(), shard_name);
      }
      auto it = shards.find(shard_name);
      if (it == shards.end()) {
        files_.push_back(std::make_unique<SafetensorsFile>(model_dir / shard_name));
        it = shards.emplace(shard_name, files_.back().get()).first;
      }
      if (!it->second->contains(tensor)) {
        fail(ErrorKind::kNotFound, "{}: tensor '{}' listed in the index is missing",
             it->second->path().string(), tensor);
      }
      where_[tensor] = it->second;
    }
  } else if (path_exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, t] : files_.back()->tensors()) where_[name] = files_.back().get();
  } else {
    fail(ErrorKind::kNotFound, "{}: no model.safetensors or model.safetensors.index.json",
         model_dir.string());
  }
}

const TensorView& TensorStore::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) fail(ErrorKind::kNotFound, "checkpoint has no tensor '{}'", name);
  return it->second->get(name);
}

const TensorView& TensorStore::get(const std::string& name,
                                   const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  if (t.shape != shape) {
    fail(ErrorKind::kInvalidFile, "tensor '{}' has shape {} but the config implies [{}]", name,
         t.shape_string(), fmt::join(shape, ", "));
  }
  return t;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    const uint64_t bytes = n * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned
  write_file_atomically(path, [&](std::ostream& out) {
    const uint64_t len = h.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& t : tensors) {
      uint64_t n = 1;
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      out.write(static_cast<const char*>(t.data),
                static_cast<std::streamsize>(n * dtype_size(t.dtype)));
    }
  });
}

}  // namespace ekva
