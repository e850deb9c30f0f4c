#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace ekva {

KvPool::KvPool(int head_dim, int page_size) : head_dim_(head_dim), page_size_(page_size) {
  if (head_dim <= 0 || page_size <= 0) {
    fail(ErrorKind::kInvalidArgument,
         "KV pool needs positive head_dim and page_size, got {} and {}", head_dim, page_size);
  }
}

KvPool::KvPool(const KvPool& other)
    : head_dim_(other.head_dim_),
      page_size_(other.page_size_),
      free_(other.free_),
      pages_in_use_(other.pages_in_use_) {
  const size_t floats = static_cast<size_t>(kPagesPerChunk) * page_bytes() / sizeof(float);
  chunks_.reserve(other.chunks_.size());
  for (const auto& chunk : other.chunks_) {
    std::unique_ptr<float[]> copy(new (std::nothrow) float[floats]);
    if (!copy) {
      fail(ErrorKind::kOutOfMemory, "KV pool copy: cannot allocate {} bytes for {} chunks",
           floats * sizeof(float), other.chunks_.size());
    }
    std::memcpy(copy.get(), chunk.get(), floats * sizeof(float));
    chunks_.push_back(std::move(copy));
  }
}

KvPool& KvPool::operator=(const KvPool& other) {
  if (this != &other) *this = KvPool(other);
  return *this;
}

int32_t KvPool::allocate() {
  if (free_.empty()) {
    const size_t floats = static_cast<size_t>(kPagesPerChunk) * page_bytes() / sizeof(float);
    std::unique_ptr<float[]> chunk(new (std::nothrow) float[floats]);
    if (!chunk) {
      fail(ErrorKind::kOutOfMemory, "KV pool: cannot allocate {} more bytes ({} pages in use)",
           floats * sizeof(float), pages_in_use_);
    }
    const int32_t first = static_cast<int32_t>(chunks_.size()) * kPagesPerChunk;
    chunks_.push_back(std::move(chunk));
    for (int32_t p = first + kPagesPerChunk - 1; p >= first; --p) free_.push_back(p);
  }
  const int32_t page = free_.back();
  free_.pop_back();
  ++pages_in_use_;
  return page;
}

void KvPool::release(int32_t page) {
  free_.push_back(page);
  --pages_in_use_;
}

float* KvPool::page_data(int32_t page) {
  const size_t page_floats = page_bytes() / sizeof(float);
  return chunks_[page / kPagesPerChunk].get() +
         static_cast<size_t>(page % kPagesPerChunk) * page_floats;
}

KvCache::KvCache(const ModelSpec& spec, int num_sequences, int page_size)
    : num_sequences_(num_sequences),
      num_layers_(spec.num_layers),
      num_kv_heads_(spec.num_kv_heads),
      pool_(spec.head_dim, page_size),
      tables_(static_cast<size_t>(num_sequences) * spec.num_layers * spec.num_kv_heads),
      next_position_(num_sequences, 0) {
  if (num_sequences <= 0) fail(ErrorKind::kInvalidArgument, "KV cache needs at least one sequence");
}

float* KvCache::row(HeadTable& t, int slot, bool value) {
  const int32_t page = t.pages[slot / page_size()];
  float* base = value ? pool_.values(page) : pool_.keys(page);
  return base + static_cast<size_t>(slot % page_size()) * head_dim();
}

void KvCache::move_slot(HeadTable& t, int to, int from) {
  std::memcpy(row(t, to, false), row(t, from, false), head_dim() * sizeof(float));
  std::memcpy(row(t, to, true), row(t, from, true), head_dim() * sizeof(float));
  t.meta[to] = t.meta[from];
}

int KvCache::append(int seq, int layer, int kv_head, const float* key, const float* value,
                    TokenMeta meta) {
  HeadTable& t = table(seq, layer, kv_head);
  const int slot = t.size();
  if (slot % page_size() == 0) t.pages.push_back(pool_.allocate());
  t.meta.push_back(meta);
  std::memcpy(row(t, slot, false), key, head_dim() * sizeof(float));
  std::memcpy(row(t, slot, true), value, head_dim() * sizeof(float));
  return slot;
}

void KvCache::evict(int seq, int layer, int kv_head, int slot) {
  HeadTable& t = table(seq, layer, kv_head);
  if (slot < 0 || slot >= t.size()) {
    fail(ErrorKind::kInvalidArgument, "evict: slot {} out of range (table holds {})", slot,
         t.size());
  }
  const int last = t.size() - 1;
  if (slot != last) move_slot(t, slot, last);
  t.meta.pop_back();
  if (last % page_size() == 0) {
    pool_.release(t.pages.back());
    t.pages.pop_back();
  }
}

void KvCache::evict_flagged(int seq, int layer, int kv_head, const std::vector<uint8_t>& flags) {
  HeadTable& t = table(seq, layer, kv_head);
  if (static_cast<int>(flags.size()) != t.size()) {
    fail(ErrorKind::kInvalidArgument, "evict_flagged: {} flags for a table of {} slots",
         flags.size(), t.size());
  }
  const int kept = t.size() - static_cast<int>(std::count_if(flags.begin(), flags.end(),
                                                             [](uint8_t f) { return f != 0; }));
  int survivor = kept;
  for (int hole = 0; hole < kept; ++hole) {
    if (flags[hole] == 0) continue;
    while (flags[survivor] != 0) ++survivor;
    move_slot(t, hole, survivor++);
  }
  t.meta.resize(kept);
  const size_t pages = (static_cast<size_t>(kept) + page_size() - 1) / page_size();
  while (t.pages.size() > pages) {
    pool_.release(t.pages.back());
    t.pages.pop_back();
  }
}

void KvCache::clear_sequence(int seq) {
  for (int l = 0; l < num_layers_; ++l) {
    for (int h = 0; h < num_kv_heads_; ++h) {
      HeadTable& t = table(seq, l, h);
      for (int32_t p : t.pages) pool_.release(p);
      t.pages.clear();
      t.meta.clear();
    }
  }
  next_position_[seq] = 0;
}

const float* KvCache::key(int seq, int layer, int kv_head, int slot) const {
  return const_cast<KvCache*>(this)->row(const_cast<HeadTable&>(table(seq, layer, kv_head)), slot,
                                         false);
}

const float* KvCache::value(int seq, int layer, int kv_head, int slot) const {
  return const_cast<KvCache*>(this)->row(const_cast<HeadTable&>(table(seq, layer, kv_head)), slot,
                                         true);
}

size_t KvCache::metadata_bytes_in_use() const {
  size_t bytes = 0;
  for (const HeadTable& t : tables_)
    bytes += t.meta.size() * sizeof(TokenMeta) + t.pages.size() * sizeof(int32_t);
  return bytes;
}

size_t KvCache::retained_tokens() const {
  size_t n = 0;
  for (const HeadTable& t : tables_) n += t.meta.size();
  return n;
}

}  // namespace ekva
