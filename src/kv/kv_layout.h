#pragma once
// The host side of the KV cache: which tokens each (sequence, layer, KV head) retains and where
// their K/V rows live, without the rows themselves. A fixed-capacity page allocator with a free
// list, per (sequence, layer, KV head) a ragged table (block table of pages plus per-slot token
// metadata), and each sequence's next position. Every backend keeps its K/V bytes in its own page
// storage (KvPages on the host, device pools on the GPU) addressed by the same page ids, so the
// layout alone decides appends, evictions and byte counts.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "arch/model_spec.h"
#include "core/dtype.h"

namespace ekva {

struct TokenMeta {
  int32_t position = 0;  // original position in the sequence
  int16_t expert = -1;   // primary routed expert at this layer; -1 until the router has run
  float score = 0.0f;    // the retention score a policy ranks by (accumulated attention)
};

// One (sequence, layer, KV head): slot i lives at page pages[i / page_size], row i % page_size.
struct HeadTable {
  std::vector<int32_t> pages;
  std::vector<TokenMeta> meta;
  int size() const { return static_cast<int>(meta.size()); }
};

struct SlotAddress {
  int32_t page = 0;
  int32_t row = 0;
};

// A K/V row (key and value) a compaction copies from one address to another.
struct RowMove {
  SlotAddress from;
  SlotAddress to;
};

struct KvFormat {
  int page_size = 16;
  DType dtype = DType::kF32;  // element type of the stored K and V (kF32 or kBF16)
};

// From this many tables on, a step's per-table bookkeeping runs on all threads; below it, starting
// them would cost more than the memory waits they hide.
inline constexpr int64_t kParallelTables = 1024;
// From this many slots on, a pass over a sequence's tables that reads every slot (a prompt's
// compression: pooling, head budgets, selection) runs its tables on all threads.
inline constexpr int64_t kParallelSlots = int64_t{1} << 16;

// The slots (ascending, distinct) one table loses in a compaction made elsewhere (on a device).
struct TableEviction {
  int seq = 0;
  int layer = 0;
  int kv_head = 0;
  const int32_t* slots = nullptr;  // (this header is also compiled as C++17, without std::span)
  int num_slots = 0;
};

class KvLayout {
 public:
  // capacity_pages 0: room for every sequence's every (layer, KV head) at the model's full context.
  KvLayout(const ModelSpec& spec, int num_sequences, KvFormat format = {},
           int64_t capacity_pages = 0);

  int num_sequences() const { return num_sequences_; }
  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int page_size() const { return format_.page_size; }
  DType dtype() const { return format_.dtype; }
  // Bytes of one page: page_size K rows then page_size V rows of the stored element type.
  size_t page_bytes() const {
    return 2 * static_cast<size_t>(page_size()) * head_dim_ * dtype_size(format_.dtype);
  }
  int64_t capacity_pages() const { return capacity_pages_; }
  // Page ids ever handed out are below this; storages size themselves by it.
  int64_t page_high_water() const { return high_water_; }

  HeadTable& table(int seq, int layer, int kv_head) { return tables_[index(seq, layer, kv_head)]; }
  const HeadTable& table(int seq, int layer, int kv_head) const {
    return tables_[index(seq, layer, kv_head)];
  }
  SlotAddress address(const HeadTable& t, int slot) const {
    return {t.pages[slot / page_size()], slot % page_size()};
  }
  // Adds one token's slot at the end of the table, taking a page when the table has no room;
  // throws kOutOfMemory when the capacity is used up. Returns the slot.
  int append(int seq, int layer, int kv_head, TokenMeta meta);
  // A forward step's appends: for every layer, token and KV head, as append(seq[t], layer, head,
  // {pos[t]}) in that order (the same slots and pages), with the slot of each at
  // slots[(layer * tokens + t) * kv_heads + head]. Throws kOutOfMemory, changing nothing, when
  // the capacity cannot serve the step. The layers' slots, pages and metadata are written on all
  // threads, a layer each, because at serving batch sizes every table's tail is a separate place in
  // memory that one thread would wait on in turn, and a prompt's layers each take thousands of
  // slots.
  void append_step(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos,
                   std::vector<int32_t>& slots);
  // Removes every slot whose flag is non-zero (one flag per slot) at once. With kept = the slots
  // left, the i-th flagged slot below kept receives the i-th unflagged slot at or past kept, both
  // in ascending order: only those survivors move, each move independent of the others, so a
  // device compaction produces the same order in parallel. Moves the metadata, releases emptied
  // pages and returns the K/V row moves the page storage must make.
  std::vector<RowMove> evict_flagged(int seq, int layer, int kv_head,
                                     const std::vector<uint8_t>& flags);
  // The same for the slots listed (ascending, distinct): as evict_flagged with those flagged, in
  // time proportional to the slots listed rather than the table.
  std::vector<RowMove> evict_slots(int seq, int layer, int kv_head,
                                   const std::vector<int32_t>& slots);
  // The metadata side of evict_slots for compactions a device already made on its rows, for
  // distinct tables at once: the tables are worked through on all threads (as append_step's), then
  // emptied pages are released in list order, except that each table keeps room for one more slot:
  // a decoding table whose budget fills its last page exactly would otherwise give that page back
  // and take one again every step, and each time the device's block tables would go up again. The
  // page is within what admission reserves (Engine::pages_bound counts a step's extra slot).
  void mirror_evictions(const std::vector<TableEviction>& evictions);
  void clear_sequence(int seq);

  // Tokens processed so far per sequence: the position the next token gets.
  int32_t next_position(int seq) const { return next_position_[seq]; }
  void advance(int seq, int32_t count) { next_position_[seq] += count; }

  size_t pages_in_use() const { return pages_in_use_; }
  // Changes whenever a block table gains or loses a page (a device copy of the tables is current
  // while it stays the same; lengths change without it).
  uint64_t table_version() const { return table_version_; }
  size_t kv_bytes_in_use() const { return pages_in_use_ * page_bytes(); }
  // Bytes a table of every one of `tokens` tokens per (layer, KV head) would use, one sequence.
  size_t full_bytes(int64_t tokens) const;
  size_t metadata_bytes_in_use() const;
  size_t retained_tokens() const;         // summed over all (sequence, layer, KV head) tables
  size_t retained_tokens(int seq) const;  // over the (layer, KV head) tables of one sequence

 private:
  size_t index(int seq, int layer, int kv_head) const {
    return (static_cast<size_t>(seq) * num_layers_ + layer) * num_kv_heads_ + kv_head;
  }
  // Fills pages[0 .. count) with free pages, most recently released first, then never-used ones;
  // throws kOutOfMemory, changing nothing, when fewer are free. (Pointer and count: device code,
  // C++17, includes this header.)
  void take_pages(int32_t* pages, int64_t count);
  int32_t allocate_page();
  void release_page(int32_t page);
  // Throws kInvalidArgument unless `slots` are ascending, distinct slots of `t`.
  static void check_slots(const HeadTable& t, const int32_t* slots, int num_slots);
  // evict_slots' metadata moves, and its row moves where `moves` is set.
  void compact(HeadTable& t, const int32_t* slots, int num_slots,
               std::vector<RowMove>* moves) const;
  // Releases the pages past those that the table's slots and `room` more need.
  void release_surplus_pages(HeadTable& t, int room);

  int num_sequences_;
  int num_layers_;
  int num_kv_heads_;
  int head_dim_;
  KvFormat format_;
  int64_t capacity_pages_;
  int64_t high_water_ = 0;
  std::vector<int32_t> free_;
  size_t pages_in_use_ = 0;
  uint64_t table_version_ = 0;
  std::vector<HeadTable> tables_;
  std::vector<int32_t> next_position_;
};

}  // namespace ekva
