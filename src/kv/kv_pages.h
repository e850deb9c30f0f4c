#pragma once
// K/V bytes on the host, in the pages a KvLayout hands out: the CPU backend's page storage, and
// what device mirrors are filled from. Page p holds page_size K rows then page_size V rows of
// head_dim elements of the layout's element type (float32 or bf16). Pages are allocated in chunks
// that never move, as the layout's high-water mark grows.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_layout.h"

namespace ekva {

class KvPages {
 public:
  explicit KvPages(const KvLayout& layout);
  // Deep copies: every chunk is duplicated, so a copy can be compacted without touching the
  // original (one prefill shared by several policies).
  KvPages(const KvPages& other);
  KvPages& operator=(const KvPages& other);
  KvPages(KvPages&&) = default;
  KvPages& operator=(KvPages&&) = default;

  DType dtype() const { return dtype_; }
  int head_dim() const { return head_dim_; }
  int page_size() const { return page_size_; }
  // Chunks covering every page below the layout's high-water mark (call after appends).
  void reserve(const KvLayout& layout);
  int64_t pages_reserved() const { return static_cast<int64_t>(chunks_.size()) * kPagesPerChunk; }

  // Stores one token's key and value (head_dim floats each), rounded to the element type.
  void write(SlotAddress at, const float* key, const float* value);
  // The row as float32: a pointer into the page for float32 pages, else converted into scratch
  // (head_dim floats).
  const float* key(SlotAddress at, float* scratch) const { return row(at, false, scratch); }
  const float* value(SlotAddress at, float* scratch) const { return row(at, true, scratch); }
  // Applies a compaction's row moves, in order.
  void move_rows(std::span<const RowMove> moves);
  // Bytes of one page, and every page below bytes.size() / page_bytes() overwritten with raw pages
  // of this layout (a device pool's copy); the pages must be reserved.
  size_t page_bytes() const { return 2 * static_cast<size_t>(page_size_) * row_bytes_size(); }
  void copy_pages_from(std::span<const std::byte> bytes);

 private:
  static constexpr int kPagesPerChunk = 256;
  std::byte* row_bytes(SlotAddress at, bool value) const;
  const float* row(SlotAddress at, bool value, float* scratch) const;
  size_t row_bytes_size() const { return static_cast<size_t>(head_dim_) * dtype_size(dtype_); }

  DType dtype_;
  int head_dim_;
  int page_size_;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;
};

}  // namespace ekva
