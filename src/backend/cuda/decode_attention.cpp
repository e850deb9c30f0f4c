#include "backend/cuda/decode_attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numbers>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

// Below this many tiles per CTA the fixed cost of a piece (query load, pipeline fill, partial
// write) outweighs the parallelism gained.
constexpr int64_t kMinTilesPerCta = 2;

int64_t tiles_of(int64_t slots) {
  return (slots + kDecodeTileTokens - 1) / kDecodeTileTokens;
}

size_t align_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

// Greedy: CTAs filled in order up to `quota` tiles, a piece that follows another in the same CTA
// costing DecodeSchedule::kPieceEndTiles more.
DecodeSchedule schedule_with_quota(std::span<const int32_t> lengths, int64_t quota) {
  DecodeSchedule schedule;
  schedule.quota_tiles = quota;
  schedule.cta_piece_offsets = {0};
  schedule.segment_piece_offsets = {0};
  schedule.segment_token_offsets = {0};
  std::vector<int32_t>& pieces = schedule.pieces;
  int64_t filled = 0;
  bool cta_has_piece = false;
  for (int s = 0; s < static_cast<int>(lengths.size()); ++s) {
    if (lengths[s] == 0) {
      // An empty segment's piece reads nothing, but it still waits for the piece before it in
      // the CTA: charged like any piece's end, so that many empty segments (a server's idle
      // sequences) spread over the grid instead of queueing in one CTA.
      const int64_t cost = cta_has_piece ? DecodeSchedule::kPieceEndTiles : 0;
      if (filled + cost > quota) {
        schedule.cta_piece_offsets.push_back(schedule.num_pieces());
        filled = 0;
      } else {
        filled += cost;
      }
      pieces.insert(pieces.end(), {s, 0, 0, 0});
      cta_has_piece = true;
    }
    int64_t start = 0;
    while (start < lengths[s]) {
      // A full CTA is closed only when slots remain, so empty segments after it join it.
      int64_t cost = cta_has_piece ? DecodeSchedule::kPieceEndTiles : 0;
      if (filled + cost >= quota) {
        schedule.cta_piece_offsets.push_back(schedule.num_pieces());
        filled = 0;
        cost = 0;
      }
      int64_t take = std::min(tiles_of(lengths[s] - start), quota - filled - cost);
      // A segment's last tile that would be a CTA's only work and open a merge round of its own
      // joins the piece before it (at B = 1, L = 4097, quota 2: 32 pieces, not 33 in two rounds).
      const int64_t segment_pieces = schedule.num_pieces() - schedule.segment_piece_offsets.back();
      if (cost == 0 && filled == 0 && tiles_of(lengths[s] - start) == take + 1 &&
          (segment_pieces + 1) % kDecodeMergeBatch == 0) {
        ++take;
      }
      const int64_t end = std::min<int64_t>(lengths[s], start + take * kDecodeTileTokens);
      pieces.insert(pieces.end(), {s, static_cast<int32_t>(start), static_cast<int32_t>(end), 0});
      start = end;
      filled += cost + take;
      cta_has_piece = true;
    }
    schedule.segment_piece_offsets.push_back(schedule.num_pieces());
    schedule.segment_token_offsets.push_back(schedule.segment_token_offsets.back() + lengths[s]);
  }
  if (schedule.num_pieces() > schedule.cta_piece_offsets.back()) {
    schedule.cta_piece_offsets.push_back(schedule.num_pieces());
  }
  return schedule;
}

}  // namespace

void fail_unsupported_decode_shape(int head_dim, int group) {
  fail(ErrorKind::kUnsupported,
       "CUDA decode attention: head_dim {} with GQA group {} is not implemented (head_dim 32, 64 "
       "or 128, group 1, 2, 4 or 8)",
       head_dim, group);
}

DecodeSchedule make_decode_schedule(std::span<const int32_t> lengths, int64_t grid_ctas) {
  // Tiles, not slots: a segment's last tile is mostly partial but takes a whole tile's time, and a
  // CTA whose share spans a segment's end would run one tile more than the others.
  if (grid_ctas < 1) {
    fail(ErrorKind::kInvalidArgument, "CUDA decode attention: a grid of {} CTAs", grid_ctas);
  }
  int64_t total_tiles = 0;
  int64_t total_slots = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    if (lengths[s] < 0) {
      fail(ErrorKind::kInvalidArgument, "CUDA decode attention: segment {} has length {}", s,
           lengths[s]);
    }
    total_tiles += tiles_of(lengths[s]);
    total_slots += lengths[s];
  }
  if (total_slots > std::numeric_limits<int32_t>::max()) {
    fail(ErrorKind::kInvalidArgument,
         "CUDA decode attention: {} retained slots in one layer exceed the 32-bit schedule",
         total_slots);
  }
  // The smallest quota whose schedule fits the grid, by bisection between the even share, which
  // may not fit once piece ends are charged, and a quota that holds everything in one CTA.
  int64_t low = std::max(kMinTilesPerCta, (total_tiles + grid_ctas - 1) / grid_ctas);
  DecodeSchedule schedule = schedule_with_quota(lengths, low);
  if (schedule.num_ctas() <= grid_ctas) return schedule;
  int64_t high =
      total_tiles + DecodeSchedule::kPieceEndTiles * static_cast<int64_t>(lengths.size());
  while (high - low > 1) {
    const int64_t mid = low + (high - low) / 2;
    if (schedule_with_quota(lengths, mid).num_ctas() <= grid_ctas) {
      high = mid;
    } else {
      low = mid;
    }
  }
  return schedule_with_quota(lengths, high);
}

std::string DecodeAttentionPlan::unsupported_reason(const DecodeAttentionShape& shape) {
  if (shape.num_sequences <= 0 || shape.num_q_heads <= 0 || shape.num_kv_heads <= 0 ||
      shape.page_size <= 0) {
    return fmt::format("sequences, heads and page_size must be positive (got {}, {}/{}, {})",
                       shape.num_sequences, shape.num_q_heads, shape.num_kv_heads, shape.page_size);
  }
  if (shape.num_q_heads % shape.num_kv_heads != 0) {
    return fmt::format("{} query heads do not divide into {} KV heads", shape.num_q_heads,
                       shape.num_kv_heads);
  }
  const int group = shape.num_q_heads / shape.num_kv_heads;
  if (shape.head_dim != 32 && shape.head_dim != 64 && shape.head_dim != 128) {
    return fmt::format("head_dim {} is not implemented (32, 64 or 128)", shape.head_dim);
  }
  if (group != 1 && group != 2 && group != 4 && group != 8) {
    return fmt::format("GQA group {} is not implemented (1, 2, 4 or 8)", group);
  }
  return {};
}

int64_t DecodeAttentionPlan::grid_ctas(const DecodeAttentionShape& shape) {
  if (const std::string reason = unsupported_reason(shape); !reason.empty()) {
    fail(ErrorKind::kUnsupported, "CUDA decode attention: {}", reason);
  }
  int device = 0;
  int num_sms = 0;
  EKVA_CUDA_CHECK(cudaGetDevice(&device));
  EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const int group = shape.num_q_heads / shape.num_kv_heads;
  return static_cast<int64_t>(num_sms) *
         std::max(1, decode_attention_ctas_per_sm(shape.head_dim, group));
}

DecodeAttentionPlan::DecodeAttentionPlan(const DecodeAttentionShape& shape,
                                         std::span<const int32_t> lengths)
    : DecodeAttentionPlan(shape, lengths, grid_ctas(shape)) {}

DecodeAttentionPlan::DecodeAttentionPlan(const DecodeAttentionShape& shape,
                                         std::span<const int32_t> lengths, int64_t grid_ctas)
    : shape_(shape), grid_ctas_(grid_ctas) {
  if (const std::string reason = unsupported_reason(shape); !reason.empty()) {
    fail(ErrorKind::kUnsupported, "CUDA decode attention: {}", reason);
  }
  const int num_segments = shape.num_sequences * shape.num_kv_heads;
  if (lengths.size() != static_cast<size_t>(num_segments)) {
    fail(ErrorKind::kInvalidArgument,
         "CUDA decode attention: {} lengths given for {} sequences x {} KV heads", lengths.size(),
         shape.num_sequences, shape.num_kv_heads);
  }
  const DecodeSchedule schedule = make_decode_schedule(lengths, grid_ctas);
  total_tokens_ = schedule.segment_token_offsets.back();
  num_pieces_ = schedule.num_pieces();
  num_ctas_ = schedule.num_ctas();
  // Every CTA closes a piece at most once in the middle of a segment, so a schedule has at most
  // a piece per segment plus one per CTA: the size that makes the layout the shape's alone.
  const size_t max_pieces = static_cast<size_t>(num_segments) + static_cast<size_t>(grid_ctas);
  const size_t ints = 4 * (static_cast<size_t>(grid_ctas) + 1 + max_pieces) +
                      2 * (static_cast<size_t>(num_segments) + 1);
  schedule_.assign(align_up(ints * sizeof(int32_t)) / sizeof(int32_t), 0);
  int32_t* starts = schedule_.data();
  for (int64_t c = 0; c <= grid_ctas; ++c) {
    // CTAs past the schedule's own start at its end: they have no pieces and return at once.
    const int32_t first = c < num_ctas_ ? schedule.cta_piece_offsets[c] : num_pieces_;
    if (first < num_pieces_) {
      std::copy_n(&schedule.pieces[static_cast<size_t>(first) * 4], 3, starts + 4 * c);
    }
    starts[4 * c + 3] = first;
  }
  int32_t* pieces = starts + 4 * (grid_ctas + 1);
  std::copy(schedule.pieces.begin(), schedule.pieces.end(), pieces);
  int32_t* offsets = pieces + 4 * max_pieces;
  std::copy(schedule.segment_piece_offsets.begin(), schedule.segment_piece_offsets.end(), offsets);
  std::copy(schedule.segment_token_offsets.begin(), schedule.segment_token_offsets.end(),
            offsets + num_segments + 1);

  const int group = shape.num_q_heads / shape.num_kv_heads;
  const size_t partials = max_pieces * group;
  partial_o_offset_ = align_up(num_segments * sizeof(int32_t));
  partial_ml_offset_ = partial_o_offset_ + align_up(partials * shape.head_dim * sizeof(uint16_t));
  logits_offset_ = partial_ml_offset_ + align_up(partials * sizeof(float2));
  scratch_bytes_ =
      logits_offset_ + (shape.with_scores
                            ? align_up(static_cast<size_t>(total_tokens_) * group * sizeof(float))
                            : 0);
}

void DecodeAttentionPlan::upload(void* schedule, void* scratch, cudaStream_t stream) const {
  if (schedule == nullptr || scratch == nullptr) {
    fail(ErrorKind::kInvalidArgument, "CUDA decode attention: upload needs a schedule and scratch");
  }
  check_aligned(schedule, 16, "CUDA decode attention", "the schedule");
  check_aligned(scratch, 16, "CUDA decode attention", "the scratch");
  EKVA_CUDA_CHECK(cudaMemcpyAsync(schedule, schedule_.data(), schedule_bytes(),
                                  cudaMemcpyHostToDevice, stream));
  const size_t num_segments = static_cast<size_t>(shape_.num_sequences) * shape_.num_kv_heads;
  EKVA_CUDA_CHECK(cudaMemsetAsync(scratch, 0, num_segments * sizeof(int32_t), stream));
}

void DecodeAttentionPlan::run(const PagedKvLayer& kv, const uint16_t* q, uint16_t* out,
                              float* scores, const void* schedule, void* scratch,
                              cudaStream_t stream) const {
  if (kv.num_sequences != shape_.num_sequences || kv.num_kv_heads != shape_.num_kv_heads ||
      kv.head_dim != shape_.head_dim || kv.page_size != shape_.page_size) {
    fail(ErrorKind::kInvalidArgument,
         "CUDA decode attention: the KV layer ({} sequences, {} KV heads, head_dim {}, page_size "
         "{}) is not the planned shape ({}, {}, {}, {})",
         kv.num_sequences, kv.num_kv_heads, kv.head_dim, kv.page_size, shape_.num_sequences,
         shape_.num_kv_heads, shape_.head_dim, shape_.page_size);
  }
  if (kv.pool == nullptr || kv.page_ids == nullptr || kv.page_offsets == nullptr || q == nullptr ||
      out == nullptr || schedule == nullptr || scratch == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "CUDA decode attention: pool, block tables, q, out, schedule and scratch must be set");
  }
  // The kernels copy and prefetch the pool in 16-byte units, read q as bf16 pairs, write out as
  // bf16 quads, and read the schedule and the partials as 16-byte vectors.
  check_aligned(kv.pool, 16, "CUDA decode attention", "the pool");
  check_aligned(q, 4, "CUDA decode attention", "q");
  check_aligned(out, 8, "CUDA decode attention", "out");
  check_aligned(schedule, 16, "CUDA decode attention", "the schedule");
  check_aligned(scratch, 16, "CUDA decode attention", "the scratch");
  if (shape_.with_scores != (scores != nullptr)) {
    fail(ErrorKind::kInvalidArgument,
         "CUDA decode attention: scores must be given exactly when the plan has with_scores");
  }
  const int num_segments = shape_.num_sequences * shape_.num_kv_heads;
  const size_t max_pieces = static_cast<size_t>(num_segments) + static_cast<size_t>(grid_ctas_);
  auto* base = static_cast<char*>(scratch);
  DecodeLaunch launch{};
  launch.pool = kv.pool;
  launch.page_ids = kv.page_ids;
  launch.page_offsets = kv.page_offsets;
  launch.q = q;
  launch.out = out;
  launch.scores = scores;
  launch.cta_starts = static_cast<const int4*>(schedule);
  launch.pieces = launch.cta_starts + grid_ctas_ + 1;
  launch.segment_piece_offsets = reinterpret_cast<const int32_t*>(launch.pieces + max_pieces);
  launch.segment_token_offsets = launch.segment_piece_offsets + num_segments + 1;
  launch.partial_o = reinterpret_cast<uint16_t*>(base + partial_o_offset_);
  launch.partial_ml = reinterpret_cast<float2*>(base + partial_ml_offset_);
  launch.logits = shape_.with_scores ? reinterpret_cast<float*>(base + logits_offset_) : nullptr;
  launch.segment_counters = reinterpret_cast<int32_t*>(base);
  launch.num_ctas = static_cast<int>(grid_ctas_);
  launch.num_segments = num_segments;
  launch.num_q_heads = shape_.num_q_heads;
  launch.num_kv_heads = shape_.num_kv_heads;
  launch.head_dim = shape_.head_dim;
  launch.group = shape_.num_q_heads / shape_.num_kv_heads;
  launch.page_size = shape_.page_size;
  launch.page_shift = std::has_single_bit(static_cast<unsigned>(shape_.page_size))
                          ? std::countr_zero(static_cast<unsigned>(shape_.page_size))
                          : -1;
  launch.scale_log2 = static_cast<float>(std::numbers::log2e / std::sqrt(shape_.head_dim));
  launch_decode_attention(launch, stream);
}

}  // namespace ekva::cuda
