#pragma once
// The device side of the KV cache (src/kv/kv_layout.h) for one layer: the same paged layout in
// bf16. A page holds page_size K rows of head_dim, then page_size V rows, of one (sequence, KV
// head); segment s = sequence * num_kv_heads + kv_head owns the pages page_ids[page_offsets[s] ..
// page_offsets[s + 1]) and retains lengths[s] slots; slot i is row i % page_size of page
// page_ids[page_offsets[s] + i / page_size]. Host code allocates pages and fills the tables.
//
// Per-slot arrays (metadata, scores, flags) are pool-parallel: slot i of segment s is entry
// page * page_size + row of an array with one entry per pool row, so they move with the pages and
// need no offsets of their own.
#include <cstdint>

#include "kv/kv_layout.h"

namespace ekva::cuda {

struct PagedKvLayer {
  uint16_t* pool = nullptr;           // bf16 bits
  TokenMeta* meta = nullptr;          // pool-parallel; may be null where an operation needs none
  const int32_t* page_ids = nullptr;  // block tables, concatenated
  const int32_t* page_offsets = nullptr;  // [num_segments() + 1]
  int32_t* lengths = nullptr;             // [num_segments()]
  int num_sequences = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;

  int num_segments() const { return num_sequences * num_kv_heads; }
};

}  // namespace ekva::cuda
