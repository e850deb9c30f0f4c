#include "kv/kv_pages.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.h"

namespace ekva {

KvPages::KvPages(const KvLayout& layout)
    : dtype_(layout.dtype()), head_dim_(layout.head_dim()), page_size_(layout.page_size()) {}

KvPages::KvPages(const KvPages& other)
    : dtype_(other.dtype_), head_dim_(other.head_dim_), page_size_(other.page_size_) {
  const size_t bytes = kPagesPerChunk * page_bytes();
  chunks_.reserve(other.chunks_.size());
  for (const auto& chunk : other.chunks_) {
    std::unique_ptr<std::byte[]> copy(new (std::nothrow) std::byte[bytes]);
    if (!copy) {
      fail(ErrorKind::kOutOfMemory, "KV pages copy: cannot allocate {} bytes for {} chunks", bytes,
           other.chunks_.size());
    }
    std::memcpy(copy.get(), chunk.get(), bytes);
    chunks_.push_back(std::move(copy));
  }
}

KvPages& KvPages::operator=(const KvPages& other) {
  if (this != &other) *this = KvPages(other);
  return *this;
}

void KvPages::reserve(const KvLayout& layout) {
  const size_t bytes = kPagesPerChunk * page_bytes();
  while (pages_reserved() < layout.page_high_water()) {
    std::unique_ptr<std::byte[]> chunk(new (std::nothrow) std::byte[bytes]);
    if (!chunk) {
      fail(ErrorKind::kOutOfMemory, "KV pages: cannot allocate {} more bytes ({} pages reserved)",
           bytes, pages_reserved());
    }
    chunks_.push_back(std::move(chunk));
  }
}

void KvPages::copy_pages_from(std::span<const std::byte> bytes) {
  const int64_t pages = static_cast<int64_t>(bytes.size() / page_bytes());
  if (bytes.size() % page_bytes() != 0 || pages > pages_reserved()) {
    fail(ErrorKind::kInvalidArgument,
         "KV pages: {} bytes are not whole pages of {} bytes within the {} reserved", bytes.size(),
         page_bytes(), pages_reserved());
  }
  for (int64_t first = 0; first < pages; first += kPagesPerChunk) {
    const int64_t count = std::min<int64_t>(kPagesPerChunk, pages - first);
    std::memcpy(chunks_[first / kPagesPerChunk].get(), bytes.data() + first * page_bytes(),
                static_cast<size_t>(count) * page_bytes());
  }
}

std::byte* KvPages::row_bytes(SlotAddress at, bool value) const {
  std::byte* page = chunks_[at.page / kPagesPerChunk].get() +
                    static_cast<size_t>(at.page % kPagesPerChunk) * page_bytes();
  return page + (static_cast<size_t>(value ? page_size_ : 0) + at.row) * row_bytes_size();
}

void KvPages::write(SlotAddress at, const float* key, const float* value) {
  for (int v = 0; v < 2; ++v) {
    const float* src = v ? value : key;
    std::byte* dst = row_bytes(at, v != 0);
    if (dtype_ == DType::kF32) {
      std::memcpy(dst, src, row_bytes_size());
    } else {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (int i = 0; i < head_dim_; ++i) out[i] = f32_to_bf16(src[i]);
    }
  }
}

const float* KvPages::row(SlotAddress at, bool value, float* scratch) const {
  const std::byte* bytes = row_bytes(at, value);
  if (dtype_ == DType::kF32) return reinterpret_cast<const float*>(bytes);
  const auto* in = reinterpret_cast<const uint16_t*>(bytes);
  for (int i = 0; i < head_dim_; ++i) scratch[i] = bf16_to_f32(in[i]);
  return scratch;
}

void KvPages::move_rows(std::span<const RowMove> moves) {
  for (const RowMove& m : moves) {
    std::memcpy(row_bytes(m.to, false), row_bytes(m.from, false), row_bytes_size());
    std::memcpy(row_bytes(m.to, true), row_bytes(m.from, true), row_bytes_size());
  }
}

}  // namespace ekva
