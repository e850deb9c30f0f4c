#include "kv/kv_layout.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace ekva {

KvLayout::KvLayout(const ModelSpec& spec, int num_sequences, KvFormat format,
                   int64_t capacity_pages)
    : num_sequences_(num_sequences),
      num_layers_(spec.num_layers),
      num_kv_heads_(spec.num_kv_heads),
      head_dim_(spec.head_dim),
      format_(format),
      capacity_pages_(capacity_pages) {
  if (num_sequences <= 0) fail(ErrorKind::kInvalidArgument, "KV cache needs at least one sequence");
  if (head_dim_ <= 0 || format.page_size <= 0) {
    fail(ErrorKind::kInvalidArgument,
         "KV cache needs positive head_dim and page_size, got {} and {}", head_dim_,
         format.page_size);
  }
  if (format.dtype != DType::kF32 && format.dtype != DType::kBF16) {
    fail(ErrorKind::kUnsupported, "KV cache element type {} (supported: F32, BF16)",
         dtype_name(format.dtype));
  }
  if (capacity_pages_ <= 0) {
    const int64_t per_table = (std::max(spec.max_position, 1) + format.page_size - 1) /
                              static_cast<int64_t>(format.page_size);
    capacity_pages_ = per_table * num_sequences * num_layers_ * num_kv_heads_;
  }
  capacity_pages_ = std::min<int64_t>(capacity_pages_, std::numeric_limits<int32_t>::max());
  tables_.resize(static_cast<size_t>(num_sequences) * num_layers_ * num_kv_heads_);
  next_position_.assign(num_sequences, 0);
}

void KvLayout::take_pages(int32_t* pages, int64_t count) {
  const int64_t from_free = std::min<int64_t>(count, static_cast<int64_t>(free_.size()));
  if (count - from_free > capacity_pages_ - high_water_) {
    fail(ErrorKind::kOutOfMemory,
         "KV cache full: {} pages of {} bytes are needed and {} of the {} are free", count,
         page_bytes(), static_cast<int64_t>(free_.size()) + capacity_pages_ - high_water_,
         capacity_pages_);
  }
  for (int64_t i = 0; i < from_free; ++i) pages[i] = free_[free_.size() - 1 - i];
  for (int64_t i = from_free; i < count; ++i) {
    pages[i] = static_cast<int32_t>(high_water_ + (i - from_free));
  }
  free_.resize(free_.size() - static_cast<size_t>(from_free));
  high_water_ += count - from_free;
  pages_in_use_ += static_cast<size_t>(count);
  table_version_ += static_cast<uint64_t>(count);
}

int32_t KvLayout::allocate_page() {
  int32_t page;
  take_pages(&page, 1);
  return page;
}

void KvLayout::release_page(int32_t page) {
  free_.push_back(page);
  --pages_in_use_;
  ++table_version_;
}

int KvLayout::append(int seq, int layer, int kv_head, TokenMeta meta) {
  HeadTable& t = table(seq, layer, kv_head);
  const int slot = t.size();
  if (static_cast<size_t>(slot / page_size()) >= t.pages.size()) t.pages.push_back(allocate_page());
  t.meta.push_back(meta);
  return slot;
}

void KvLayout::append_step(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos,
                           std::vector<int32_t>& slots) {
  const int n = static_cast<int>(seq.size()), L = num_layers_, H = num_kv_heads_;
  const int64_t P = page_size();
  slots.resize(static_cast<size_t>(L) * n * H);
  // A token's slot in every one of its tables counts the step's earlier tokens of its sequence;
  // the step's tokens of each sequence, in order, are what its tables' metadata gains
  // (by_sequence: the tokens grouped by sequence, the groups in order of first appearance).
  // group: a sequence's place in `sequences`.
  std::vector<int32_t> rank(n), count(num_sequences_, 0), first(num_sequences_, 0);
  std::vector<int32_t> sequences, group(num_sequences_, 0);
  for (int t = 0; t < n; ++t) {
    if (count[seq[t]] == 0) {
      group[seq[t]] = static_cast<int32_t>(sequences.size());
      sequences.push_back(seq[t]);
    }
    rank[t] = count[seq[t]]++;
  }
  int32_t offset = 0;
  for (const int32_t s : sequences) {
    first[s] = offset;
    offset += count[s];
  }
  std::vector<int32_t> by_sequence(n);
  for (int t = 0; t < n; ++t) by_sequence[first[seq[t]] + rank[t]] = t;
  // The pages each layer's tables take: a table takes one each time a slot of its sequence's tokens
  // reaches what its pages hold. They are counted first so that a step the capacity cannot serve
  // fails before it changes anything, and so that each layer knows where its pages start in
  // append's order (layer by layer, token by token, head by head) and takes them on its own thread.
  // Each touched table's size and room are kept in arrays of each layer's own: read through the
  // tables, every token of the loop below reloaded both vectors' ends (a page's push_back could,
  // for all the compiler knows, change them).
  [[maybe_unused]] const bool parallel = static_cast<int64_t>(n) * L * H >= kParallelTables;
  const size_t group_tables = sequences.size() * H;
  std::vector<int32_t> sizes(static_cast<size_t>(L) * group_tables), room(sizes.size());
  std::vector<int64_t> layer_first(static_cast<size_t>(L) + 1, 0);
#pragma omp parallel for schedule(static) if (parallel)
  for (int l = 0; l < L; ++l) {
    int64_t layer_taken = 0;
    for (size_t g = 0; g < sequences.size(); ++g) {
      const int32_t s = sequences[g];
      for (int h = 0; h < H; ++h) {
        const HeadTable& t = table(s, l, h);
        const size_t at = l * group_tables + g * H + h;
        sizes[at] = t.size();
        room[at] = static_cast<int32_t>(t.pages.size() * P);
        const int64_t needed = (t.size() + count[s] + P - 1) / P;
        layer_taken += std::max<int64_t>(0, needed - static_cast<int64_t>(t.pages.size()));
      }
    }
    layer_first[l + 1] = layer_taken;
  }
  for (int l = 0; l < L; ++l) layer_first[l + 1] += layer_first[l];
  std::vector<int32_t> taken(static_cast<size_t>(layer_first[L]));
  take_pages(taken.data(), static_cast<int64_t>(taken.size()));
  // Each layer's slots and pages, then its tables' new metadata in one resize each, written in
  // place (appended one by one, every element's store held up the next one's reload of the
  // vector's end).
#pragma omp parallel for schedule(static) if (parallel)
  for (int l = 0; l < L; ++l) {
    const int32_t* const layer_sizes = sizes.data() + l * group_tables;
    int32_t* const layer_room = room.data() + l * group_tables;
    const int32_t* const token_seq = seq.data();
    const int32_t* const token_rank = rank.data();
    const int32_t* const sequence_group = group.data();
    const int32_t* const step_pages = taken.data();
    int32_t* const layer_slots = slots.data() + static_cast<size_t>(l) * n * H;
    int64_t next_page = layer_first[l];
    for (int t = 0; t < n; ++t) {
      const size_t first_table = static_cast<size_t>(sequence_group[token_seq[t]]) * H;
      const int32_t* const size = layer_sizes + first_table;
      int32_t* const limit = layer_room + first_table;
      int32_t* const out = layer_slots + static_cast<size_t>(t) * H;
      for (int h = 0; h < H; ++h) {
        const int32_t slot = size[h] + token_rank[t];
        if (slot >= limit[h]) {
          table(token_seq[t], l, h).pages.push_back(step_pages[next_page++]);
          limit[h] += static_cast<int32_t>(P);
        }
        out[h] = slot;
      }
    }
    for (int h = 0; h < H; ++h) {
      for (const int32_t s : sequences) {
        std::vector<TokenMeta>& meta = table(s, l, h).meta;
        const size_t base = meta.size();
        meta.resize(base + count[s]);
        TokenMeta* added = meta.data() + base;
        const int32_t* tokens = by_sequence.data() + first[s];
        for (int i = 0; i < count[s]; ++i) added[i].position = pos[tokens[i]];
      }
    }
  }
}

std::vector<RowMove> KvLayout::evict_flagged(int seq, int layer, int kv_head,
                                             const std::vector<uint8_t>& flags) {
  const HeadTable& t = table(seq, layer, kv_head);
  if (static_cast<int>(flags.size()) != t.size()) {
    fail(ErrorKind::kInvalidArgument, "evict: {} flags for a table of {} slots", flags.size(),
         t.size());
  }
  std::vector<int32_t> slots;
  for (int32_t i = 0; i < t.size(); ++i) {
    if (flags[i] != 0) slots.push_back(i);
  }
  return evict_slots(seq, layer, kv_head, slots);
}

void KvLayout::check_slots(const HeadTable& t, const int32_t* slots, int num_slots) {
  for (int i = 0; i < num_slots; ++i) {
    if (slots[i] < 0 || slots[i] >= t.size() || (i > 0 && slots[i] <= slots[i - 1])) {
      fail(ErrorKind::kInvalidArgument,
           "evict: slot {} (entry {}) is out of the table's {} slots or out of ascending order",
           slots[i], i, t.size());
    }
  }
}

void KvLayout::compact(HeadTable& t, const int32_t* slots, int num_slots,
                       std::vector<RowMove>* moves) const {
  const int32_t* end = slots + num_slots;
  const int kept = t.size() - num_slots;
  // The listed slots below kept are the holes; the survivors at or past kept are the slots there
  // that are not listed (the listed ones there are the tail of `slots`).
  const int32_t* tail = std::lower_bound(slots, end, kept);
  const int32_t* next_listed = tail;
  int survivor = kept;
  for (const int32_t* hole = slots; hole != tail; ++hole) {
    while (next_listed != end && *next_listed == survivor) {
      ++next_listed;
      ++survivor;
    }
    if (moves != nullptr) moves->push_back({address(t, survivor), address(t, *hole)});
    t.meta[*hole] = t.meta[survivor++];
  }
  t.meta.resize(kept);
}

void KvLayout::release_surplus_pages(HeadTable& t, int room) {
  const size_t pages = (t.meta.size() + room + page_size() - 1) / page_size();
  while (t.pages.size() > pages) {
    release_page(t.pages.back());
    t.pages.pop_back();
  }
}

std::vector<RowMove> KvLayout::evict_slots(int seq, int layer, int kv_head,
                                           const std::vector<int32_t>& slots) {
  HeadTable& t = table(seq, layer, kv_head);
  const int n = static_cast<int>(slots.size());
  check_slots(t, slots.data(), n);
  std::vector<RowMove> moves;
  compact(t, slots.data(), n, &moves);
  release_surplus_pages(t, 0);
  return moves;
}

void KvLayout::mirror_evictions(const std::vector<TableEviction>& evictions) {
  for (const TableEviction& e : evictions) {
    check_slots(table(e.seq, e.layer, e.kv_head), e.slots, e.num_slots);
  }
  const int64_t n = static_cast<int64_t>(evictions.size());
#pragma omp parallel for schedule(static) if (n >= kParallelTables)
  for (int64_t i = 0; i < n; ++i) {
    const TableEviction& e = evictions[i];
    compact(table(e.seq, e.layer, e.kv_head), e.slots, e.num_slots, nullptr);
  }
  for (const TableEviction& e : evictions) {
    release_surplus_pages(table(e.seq, e.layer, e.kv_head), 1);
  }
}

void KvLayout::clear_sequence(int seq) {
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      HeadTable& t = table(seq, l, h);
      for (int32_t p : t.pages) release_page(p);
      t.pages.clear();
      t.meta.clear();
    }
  }
  next_position_[seq] = 0;
}

size_t KvLayout::full_bytes(int64_t tokens) const {
  const size_t pages_per_table = static_cast<size_t>((tokens + page_size() - 1) / page_size());
  return pages_per_table * num_layers_ * num_kv_heads_ * page_bytes();
}

size_t KvLayout::metadata_bytes_in_use() const {
  size_t bytes = 0;
  for (const HeadTable& t : tables_)
    bytes += t.meta.size() * sizeof(TokenMeta) + t.pages.size() * sizeof(int32_t);
  return bytes;
}

size_t KvLayout::retained_tokens() const {
  size_t n = 0;
  for (const HeadTable& t : tables_) n += t.meta.size();
  return n;
}

size_t KvLayout::retained_tokens(int seq) const {
  size_t n = 0;
  for (int l = 0; l < num_layers(); ++l) {
    for (int h = 0; h < num_kv_heads(); ++h) n += table(seq, l, h).meta.size();
  }
  return n;
}

}  // namespace ekva
