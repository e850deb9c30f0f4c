#pragma once
// Decode attention over the paged ragged KV cache: one query token per sequence attends to every
// retained slot of its (sequence, KV head). bf16 storage, fp32 accumulation, softmax scale
// 1/sqrt(head_dim), query head h reads KV head h / (num_q_heads / num_kv_heads), as
// ekva::cpu::attention does.
//
// Plan/run split, as FlashInfer: the plan turns the host's lengths into a balanced schedule (each
// CTA of a persistent grid gets the same work in 64-slot tiles, cut across segments: split-K that
// fills the GPU for one long sequence and for many short ones alike); upload() copies that schedule
// to the device; run() launches the attention kernel, which also merges the splits (with per-slot
// scores, a second kernel merges them). The launch does not depend on the lengths: the grid is
// always the whole persistent grid, and the schedule's size and layout depend on the shape alone,
// so that a captured CUDA graph replays with the next step's schedule in the same place.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/paged_kv.h"

namespace ekva::cuda {

struct DecodeAttentionShape {
  int num_sequences = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  bool with_scores = false;  // also write each slot's attention weight summed over its group
};

// How a layer's slots are cut into pieces for a persistent grid of at most grid_ctas CTAs: CTAs
// are filled in order with 64-slot tiles up to the same cost, cut across segments; a segment's
// pieces are consecutive and tile-aligned within it, and an empty segment has one piece of no
// slots (so that its output is written too), whose end is charged as any piece's. A segment's last
// tile that would be a CTA's only work and its (32k + 1)-th piece joins the piece before it, one
// tile over the quota. Host-only, so that it is testable without a GPU.
struct DecodeSchedule {
  // What a piece that follows another in the same CTA costs on top of its tiles. Its start waits
  // for the end of the piece before it (partial, count, next query), which under full load took
  // 3-4 us, as long as about two tiles take a CTA; uncharged, those CTAs finished last. Ragged
  // over uniform time, charging 0 and 3 tiles (one run, inputs rotated as in the full benchmark):
  // B = 1, L = 4k 1.32, 1.09; B = 1, L = 16k 1.16, 1.03; B = 8, L = 4k 1.11, 1.04; B = 64, L = 4k
  // 1.03, 1.01. Charging 1, 2, 4 or 5 was no better (measured with inputs not rotated).
  static constexpr int64_t kPieceEndTiles = 3;
  // The cost (tiles plus piece ends) no CTA exceeds but by such a last tile: the smallest whose
  // schedule fits the grid.
  int64_t quota_tiles = 0;
  std::vector<int32_t> pieces;  // 4 per piece: segment, first slot, end slot, 0
  // CTA c runs pieces [cta_piece_offsets[c], cta_piece_offsets[c + 1]); segment s has pieces
  // [segment_piece_offsets[s], segment_piece_offsets[s + 1]); segment_token_offsets are the
  // lengths' prefix sums.
  std::vector<int32_t> cta_piece_offsets;
  std::vector<int32_t> segment_piece_offsets;
  std::vector<int32_t> segment_token_offsets;

  int num_pieces() const { return static_cast<int>(pieces.size() / 4); }
  int num_ctas() const { return static_cast<int>(cta_piece_offsets.size()) - 1; }
};
DecodeSchedule make_decode_schedule(std::span<const int32_t> lengths, int64_t grid_ctas);

class DecodeAttentionPlan {
 public:
  // Empty when the kernels implement the shape, else the reason they do not.
  static std::string unsupported_reason(const DecodeAttentionShape& shape);
  static bool can_implement(const DecodeAttentionShape& shape) {
    return unsupported_reason(shape).empty();
  }

  // The persistent grid the kernel runs on the current device: its multiprocessors times the
  // CTAs of the shape's kernel that fit on one.
  static int64_t grid_ctas(const DecodeAttentionShape& shape);

  // lengths: the retained slots of each segment (sequence * num_kv_heads + kv_head), as the run
  // will see them; grid_ctas as above (the first form asks the device).
  DecodeAttentionPlan(const DecodeAttentionShape& shape, std::span<const int32_t> lengths);
  DecodeAttentionPlan(const DecodeAttentionShape& shape, std::span<const int32_t> lengths,
                      int64_t grid_ctas);

  // The schedule's bytes on the device: the same for every plan of a shape and grid.
  size_t schedule_bytes() const { return schedule_.size() * sizeof(int32_t); }
  // The scratch a run needs: merge counters, the splits' partials and, with scores, the logits
  // of the layer's retained slots (the only part that grows with the lengths). Plans of one shape
  // can share a scratch, one run after another.
  size_t scratch_bytes() const { return scratch_bytes_; }
  // The schedule as upload() copies it, for a caller that stages several plans' at once.
  std::span<const int32_t> schedule() const { return schedule_; }
  // Copies the schedule to `schedule` and zeroes the scratch's merge counters (stream-ordered).
  // Runs leave the counters at zero, so a scratch needs zeroing once, not once per plan.
  void upload(void* schedule, void* scratch, cudaStream_t stream) const;
  // q and out: [num_sequences, num_q_heads, head_dim] bf16, q 4-byte and out 8-byte aligned; the
  // pool, the schedule and the scratch 16-byte aligned. scores: null, or (with_scores) a
  // pool-parallel float array that receives, for every retained slot, the attention weight summed
  // over the query heads of its KV head.
  void run(const PagedKvLayer& kv, const uint16_t* q, uint16_t* out, float* scores,
           const void* schedule, void* scratch, cudaStream_t stream) const;

  // The CTAs the schedule gives work to (the launch is always the whole grid).
  int num_ctas() const { return num_ctas_; }
  int num_pieces() const { return num_pieces_; }
  int64_t total_tokens() const { return total_tokens_; }

 private:
  DecodeAttentionShape shape_;
  int64_t grid_ctas_ = 0;
  int num_ctas_ = 0;
  int num_pieces_ = 0;
  int64_t total_tokens_ = 0;
  // CTA starts [grid + 1] and pieces [segments + grid] (4 ints each), then the segment piece and
  // token offsets [segments + 1] each, zero-padded to 256 bytes.
  std::vector<int32_t> schedule_;
  size_t partial_o_offset_ = 0;  // in the scratch, after the merge counters
  size_t partial_ml_offset_ = 0;
  size_t logits_offset_ = 0;
  size_t scratch_bytes_ = 0;
};

}  // namespace ekva::cuda
