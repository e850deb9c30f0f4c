#pragma once
// The KV cache: a paged pool plus, per (sequence, layer, KV head), a ragged table of the tokens it
// retains. Only retained tokens occupy memory; eviction fills holes with slots from the end, so no
// other slot moves (one slot: swap-remove in O(1)). Keys are stored after RoPE, so a retained token
// never needs its neighbours again.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model_spec.h"

namespace ekva {

// Fixed-size pages, each holding page_size K rows then page_size V rows of one (sequence, layer,
// KV head). Pages are allocated in chunks that never move; freed pages are reused first.
class KvPool {
 public:
  KvPool(int head_dim, int page_size);
  // Deep copies: every chunk is duplicated, so a copy can be compressed without touching the
  // original (one prefill shared by several policies).
  KvPool(const KvPool& other);
  KvPool& operator=(const KvPool& other);
  KvPool(KvPool&&) = default;
  KvPool& operator=(KvPool&&) = default;

  int32_t allocate();
  void release(int32_t page);
  float* keys(int32_t page) { return page_data(page); }
  float* values(int32_t page) {
    return page_data(page) + static_cast<size_t>(page_size_) * head_dim_;
  }
  const float* keys(int32_t page) const { return const_cast<KvPool*>(this)->keys(page); }
  const float* values(int32_t page) const { return const_cast<KvPool*>(this)->values(page); }

  int page_size() const { return page_size_; }
  int head_dim() const { return head_dim_; }
  size_t page_bytes() const {
    return 2 * static_cast<size_t>(page_size_) * head_dim_ * sizeof(float);
  }
  size_t pages_in_use() const { return pages_in_use_; }
  size_t pages_reserved() const { return chunks_.size() * kPagesPerChunk; }

 private:
  static constexpr int kPagesPerChunk = 256;
  float* page_data(int32_t page);

  int head_dim_;
  int page_size_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<int32_t> free_;
  size_t pages_in_use_ = 0;
};

struct TokenMeta {
  int32_t position = 0;  // original position in the sequence
  int16_t expert = -1;   // primary routed expert at this layer; -1 until the router has run
  int16_t second = -1;   // second routed expert (top-2 and wider routers), -1 if none
  float gate = 0.0f;     // the primary expert's gate weight
  float score = 0.0f;    // the retention score a policy ranks by (accumulated attention)
};

// One (sequence, layer, KV head): slot i lives at page pages[i / page_size], row i % page_size.
struct HeadTable {
  std::vector<int32_t> pages;
  std::vector<TokenMeta> meta;
  int size() const { return static_cast<int>(meta.size()); }
};

class KvCache {
 public:
  KvCache(const ModelSpec& spec, int num_sequences, int page_size = 16);
  // Copies are deep (the pool's pages included): compressing a copy leaves this cache as it was.
  KvCache(const KvCache&) = default;
  KvCache& operator=(const KvCache&) = default;

  int num_sequences() const { return num_sequences_; }
  int num_layers() const { return num_layers_; }
  int num_kv_heads() const { return num_kv_heads_; }
  int head_dim() const { return pool_.head_dim(); }
  int page_size() const { return pool_.page_size(); }

  HeadTable& table(int seq, int layer, int kv_head) { return tables_[index(seq, layer, kv_head)]; }
  const HeadTable& table(int seq, int layer, int kv_head) const {
    return tables_[index(seq, layer, kv_head)];
  }
  // Appends one token's key and value (head_dim floats each); returns its slot.
  int append(int seq, int layer, int kv_head, const float* key, const float* value, TokenMeta meta);
  // Removes a slot by moving the last slot into it: O(1), no other slot moves.
  void evict(int seq, int layer, int kv_head, int slot);
  // Removes every slot whose flag is non-zero (one flag per slot) at once. With kept = the slots
  // left, the i-th flagged slot below kept receives the i-th unflagged slot at or past kept, both
  // in ascending order: only those survivors move, and each move is independent of the others, so
  // the device compaction (cuda::evict_flagged) produces the same order in parallel. One flag is
  // the same as evict().
  void evict_flagged(int seq, int layer, int kv_head, const std::vector<uint8_t>& flags);
  void clear_sequence(int seq);

  const float* key(int seq, int layer, int kv_head, int slot) const;
  const float* value(int seq, int layer, int kv_head, int slot) const;
  const KvPool& pool() const { return pool_; }

  // Tokens processed so far per sequence: the position the next token gets.
  int32_t next_position(int seq) const { return next_position_[seq]; }
  void advance(int seq, int32_t count) { next_position_[seq] += count; }

  size_t kv_bytes_in_use() const { return pool_.pages_in_use() * pool_.page_bytes(); }
  size_t metadata_bytes_in_use() const;
  size_t retained_tokens() const;  // summed over all (sequence, layer, KV head) tables

 private:
  size_t index(int seq, int layer, int kv_head) const {
    return (static_cast<size_t>(seq) * num_layers_ + layer) * num_kv_heads_ + kv_head;
  }
  float* row(HeadTable& t, int slot, bool value);
  // Copies slot `from`'s key, value and metadata into slot `to`.
  void move_slot(HeadTable& t, int to, int from);

  int num_sequences_;
  int num_layers_;
  int num_kv_heads_;
  KvPool pool_;
  std::vector<HeadTable> tables_;
  std::vector<int32_t> next_position_;
};

}  // namespace ekva
