#include "backend/cuda/kv_ops.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace ekva::cuda {
namespace {

void check_layer(const PagedKvLayer& kv, const char* op) {
  if (kv.pool == nullptr || kv.page_ids == nullptr || kv.page_offsets == nullptr ||
      kv.lengths == nullptr) {
    fail(ErrorKind::kInvalidArgument, "{}: pool, block tables and lengths must be set", op);
  }
  if (kv.num_sequences <= 0 || kv.num_kv_heads <= 0 || kv.page_size <= 0 || kv.head_dim <= 0 ||
      kv.head_dim % 8 != 0 || kv.head_dim > 128) {
    fail(ErrorKind::kInvalidArgument,
         "{}: needs positive sequences, KV heads and page_size and a head_dim that is a multiple "
         "of 8 up to 128 (got {}, {}, {}, {})",
         op, kv.num_sequences, kv.num_kv_heads, kv.page_size, kv.head_dim);
  }
}

size_t align_up(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

void append_kv(const PagedKvLayer& kv, const KvAppend& append, cudaStream_t stream) {
  check_layer(kv, "append_kv");
  if (append.count < 0) {
    fail(ErrorKind::kInvalidArgument, "append_kv: count {} is negative", append.count);
  }
  if (append.count == 0) return;
  if (append.keys == nullptr || append.values == nullptr || append.sequences == nullptr ||
      append.positions == nullptr || append.slots == nullptr || append.rotations == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "append_kv: keys, values, sequences, positions, slots and rotations must be set");
  }
  if (append.queries != nullptr &&
      (append.num_q_heads <= 0 ||
       (!append.queries_in_place && append.query_rows_bf16 == nullptr))) {
    fail(
        ErrorKind::kInvalidArgument,
        "append_kv: queries need their head count ({}) and somewhere to go (in place or bf16 rows)",
        append.num_q_heads);
  }
  if ((append.q_norm == nullptr) != (append.k_norm == nullptr) ||
      (append.q_norm != nullptr && append.queries == nullptr)) {
    fail(ErrorKind::kInvalidArgument,
         "append_kv: QK-norm needs both norm weights and the queries (q_norm {}, k_norm {}, "
         "queries {})",
         append.q_norm != nullptr, append.k_norm != nullptr, append.queries != nullptr);
  }
  if (append.projection_inverse_rms != nullptr && append.q_norm == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "append_kv: a whole projection's inverse RMS needs the QK-norm weights");
  }
  // The kernel reads a row's halves and its rotations and norm weights as 16-byte vectors and
  // writes bf16 quads.
  for (const auto& [p, what] : {std::pair<const void*, const char*>{append.keys, "keys"},
                                {append.values, "values"},
                                {append.queries, "queries"},
                                {append.rotations, "rotations"},
                                {append.q_norm, "q_norm"},
                                {append.k_norm, "k_norm"}}) {
    check_aligned(p, 16, "append_kv", what);
  }
  check_aligned(append.query_rows_bf16, 8, "append_kv", "query_rows_bf16");
  check_aligned(append.projection_inverse_rms, 4, "append_kv", "projection_inverse_rms");
  check_aligned(kv.pool, 8, "append_kv", "the pool");
  launch_append_kv({kv.pool,
                    kv.meta,
                    kv.page_ids,
                    kv.page_offsets,
                    kv.lengths,
                    append.keys,
                    append.values,
                    append.sequences,
                    append.positions,
                    append.slots,
                    append.rotations,
                    append.count,
                    kv.num_kv_heads,
                    kv.head_dim,
                    kv.page_size,
                    append.queries,
                    append.queries != nullptr ? append.num_q_heads : 0,
                    append.queries_in_place,
                    append.query_rows,
                    append.query_rows_bf16,
                    append.q_norm,
                    append.k_norm,
                    append.norm_eps,
                    append.projection_inverse_rms},
                   stream);
}

void rope_rotations(const int32_t* positions, int count, const float* inv_freq, int half,
                    float attention_factor, float2* rotations, cudaStream_t stream) {
  if (count < 0 || half <= 0) {
    fail(ErrorKind::kInvalidArgument, "rope_rotations: needs count >= 0 and half > 0 (got {}, {})",
         count, half);
  }
  if (count == 0) return;
  if (positions == nullptr || inv_freq == nullptr || rotations == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "rope_rotations: positions, inv_freq and rotations must be set");
  }
  launch_rope_rotations(positions, count, inv_freq, half, attention_factor, rotations, stream);
}

size_t compaction_workspace_bytes(int64_t pool_rows, int num_segments) {
  return 2 * align_up(static_cast<size_t>(pool_rows) * sizeof(int32_t)) +
         align_up(static_cast<size_t>(num_segments) * sizeof(int32_t));
}

void evict_flagged(const PagedKvLayer& kv, const uint8_t* evict_flags, int64_t pool_rows,
                   void* workspace, cudaStream_t stream) {
  check_layer(kv, "evict_flagged");
  if (evict_flags == nullptr || workspace == nullptr) {
    fail(ErrorKind::kInvalidArgument, "evict_flagged: flags and workspace must be set");
  }
  if (pool_rows <= 0 || pool_rows > std::numeric_limits<int32_t>::max()) {
    fail(ErrorKind::kInvalidArgument, "evict_flagged: {} pool rows do not fit the 32-bit scratch",
         pool_rows);
  }
  int device = 0;
  int num_sms = 0;
  EKVA_CUDA_CHECK(cudaGetDevice(&device));
  EKVA_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  auto* base = static_cast<char*>(workspace);
  const size_t rows_bytes = align_up(static_cast<size_t>(pool_rows) * sizeof(int32_t));
  CompactLaunch launch{};
  launch.pool = kv.pool;
  launch.meta = kv.meta;
  launch.page_ids = kv.page_ids;
  launch.page_offsets = kv.page_offsets;
  launch.lengths = kv.lengths;
  launch.evict_flags = evict_flags;
  launch.hole_rows = reinterpret_cast<int32_t*>(base);
  launch.kept_rows = reinterpret_cast<int32_t*>(base + rows_bytes);
  launch.move_counts = reinterpret_cast<int32_t*>(base + 2 * rows_bytes);
  launch.num_segments = kv.num_segments();
  launch.head_dim = kv.head_dim;
  launch.page_size = kv.page_size;
  // About 32 copying CTAs per multiprocessor, whatever the number of segments: with half the slots
  // evicted a warp then copies about one batch of moves, and the hardware's scheduling of many
  // short CTAs balances the segments better than fewer, longer ones (8 per SM: 2-3% slower).
  launch.copy_blocks_per_segment = std::max(1, 32 * num_sms / kv.num_segments());
  launch_compact_kv(launch, stream);
}

void evict_decode(uint16_t* pool, TokenMeta* meta, int32_t* ints, int page_size, int head_dim,
                  const DecodeEvictions& e, cudaStream_t stream) {
  if (e.count < 0 || e.max_evictions < 1 || e.max_evictions > kMaxDecodeEvictions ||
      page_size <= 0 || head_dim <= 0 || head_dim % 8 != 0 || head_dim > 128) {
    fail(ErrorKind::kInvalidArgument,
         "evict_decode: {} segments, {} evictions each at most (1 to {}), page size {}, head_dim "
         "{} (a multiple of 8, at most 128)",
         e.count, e.max_evictions, kMaxDecodeEvictions, page_size, head_dim);
  }
  if (e.count == 0) return;
  if (pool == nullptr || meta == nullptr || ints == nullptr || e.params == nullptr ||
      e.pinned == nullptr || e.evicted == nullptr || e.num_evicted == nullptr) {
    fail(ErrorKind::kInvalidArgument,
         "evict_decode: pool, metadata, tables, parameters, pinned positions and outputs must be "
         "set");
  }
  launch_evict_decode({pool, meta, ints, e.params, e.pinned, e.evicted, e.num_evicted, e.count,
                       e.max_evictions, page_size, head_dim},
                      stream);
}

}  // namespace ekva::cuda
