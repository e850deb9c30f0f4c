#pragma once
// What a KV policy decides and a backend executes: per (sequence, layer, KV head) segment, how
// many slots stay, which positions are protected (sinks, the recent window) and, for grouped
// policies, each group's quota. Backends select by the slots' scores and compact their pages;
// select_evictions is the reference selection every backend must reproduce (ties included).
#include <cstdint>
#include <vector>

#include "kv/kv_layout.h"
#include "kv/kv_pages.h"

namespace ekva {

struct SegmentEviction {
  int layer = 0;
  int kv_head = 0;
  int keep = 0;             // slots left afterwards (protected ones beyond it are kept as well)
  int sinks = 0;            // positions below this are kept
  int32_t recent_from = 0;  // positions at or after this are kept
  std::vector<int> quota;   // per group: the best-scored slots kept first; empty: no groups
  std::vector<int16_t> slot_group;  // per slot, when quota is given
  std::vector<int32_t> pinned;      // positions kept as well (ascending): a policy's reserve
};

// One sequence's eviction.
struct EvictionPlan {
  int seq = 0;
  // Every segment of the sequence (listed or not) has its scores max-pooled over positions with
  // this width before selecting, as SnapKV smooths its votes; 1: as they are. The pooled scores
  // stay in the metadata.
  int pool_kernel = 1;
  std::vector<SegmentEviction> segments;
};

// The reference selection of one segment, flags per slot (1: evict). Protected slots (sinks, the
// recent window, pinned positions) stay and count towards keep; of the
// others, each group first keeps its best up to its quota, then the best of the rest fill the
// remaining room. Best: higher score, then earlier position.
std::vector<uint8_t> select_evictions(const HeadTable& table, const SegmentEviction& segment);

// A plan's selection as every backend makes it: pools the sequence's scores (plan.pool_kernel),
// then select_evictions per segment; flags[i] belongs to plan.segments[i].
std::vector<std::vector<uint8_t>> select_plan_evictions(const EvictionPlan& plan, KvLayout& layout);

// Executes a plan over host pages: selects (select_plan_evictions), compacts the layout and moves
// the pages' rows. The CPU backend's apply.
void apply_on_host(const EvictionPlan& plan, KvLayout& layout, KvPages& pages);

// Max-pools the scores of a table over positions (window `kernel`, centred), as SnapKV smooths
// its votes.
void pool_scores(HeadTable& table, int kernel);

}  // namespace ekva
