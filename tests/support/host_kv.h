#pragma once
// A KV layout with host pages, filled by hand: what tests of the layout, the CPU attention and the
// device mirrors start from.
#include <cstdint>
#include <vector>

#include "kv/kv_layout.h"
#include "kv/kv_pages.h"

namespace ekva::testing {

struct HostKv {
  HostKv(const ModelSpec& spec, int num_sequences, int page_size = 16, DType dtype = DType::kF32)
      : layout(spec, num_sequences, KvFormat{page_size, dtype}), pages(layout) {}

  int num_sequences() const { return layout.num_sequences(); }
  int num_layers() const { return layout.num_layers(); }
  int num_kv_heads() const { return layout.num_kv_heads(); }
  int head_dim() const { return layout.head_dim(); }
  int page_size() const { return layout.page_size(); }
  HeadTable& table(int seq, int layer, int kv_head) { return layout.table(seq, layer, kv_head); }
  const HeadTable& table(int seq, int layer, int kv_head) const {
    return layout.table(seq, layer, kv_head);
  }
  int append(int seq, int layer, int kv_head, const float* key, const float* value,
             TokenMeta meta) {
    const int slot = layout.append(seq, layer, kv_head, meta);
    pages.reserve(layout);
    pages.write(layout.address(table(seq, layer, kv_head), slot), key, value);
    return slot;
  }
  void evict_flagged(int seq, int layer, int kv_head, const std::vector<uint8_t>& flags) {
    pages.move_rows(layout.evict_flagged(seq, layer, kv_head, flags));
  }
  void evict(int seq, int layer, int kv_head, int slot) {
    std::vector<uint8_t> flags(table(seq, layer, kv_head).size(), 0);
    flags.at(slot) = 1;
    evict_flagged(seq, layer, kv_head, flags);
  }
  // Rows as float32 (float32 pages only: a pointer into the page).
  const float* key(int seq, int layer, int kv_head, int slot) const {
    return pages.key(layout.address(table(seq, layer, kv_head), slot), nullptr);
  }
  const float* value(int seq, int layer, int kv_head, int slot) const {
    return pages.value(layout.address(table(seq, layer, kv_head), slot), nullptr);
  }

  KvLayout layout;
  KvPages pages;
};

}  // namespace ekva::testing
