#include "backend/cuda/decode_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/dispatch.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

struct Case {
  int num_sequences;
  int num_kv_heads;
  int group;
  int head_dim;
  int page_size;
  int max_length;     // lengths drawn in [0, max_length]
  int fixed_length;   // when > 0: segment 0 gets exactly this many slots
  float query_scale;  // larger: a peakier softmax
  bool with_scores;
};

// Reference weights: per slot, the softmax weight summed over the group's query heads, in double.
std::vector<double> reference_weights(const testing::HostKv& cache, const std::vector<float>& q,
                                      int seq, int kv_head, int group) {
  const HeadTable& t = cache.table(seq, 0, kv_head);
  const int d = cache.head_dim();
  const int num_q_heads = cache.num_kv_heads() * group;
  std::vector<double> weights(t.size(), 0.0);
  std::vector<double> logits(t.size());
  for (int g = 0; g < group; ++g) {
    const float* qh = q.data() + (static_cast<size_t>(seq) * num_q_heads + kv_head * group + g) * d;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int s = 0; s < t.size(); ++s) {
      const float* k = cache.key(seq, 0, kv_head, s);
      double dot = 0.0;
      for (int j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * k[j];
      logits[s] = dot / std::sqrt(static_cast<double>(d));
      max_logit = std::max(max_logit, logits[s]);
    }
    double sum = 0.0;
    for (int s = 0; s < t.size(); ++s) sum += std::exp(logits[s] - max_logit);
    for (int s = 0; s < t.size(); ++s) weights[s] += std::exp(logits[s] - max_logit) / sum;
  }
  return weights;
}

void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int num_q_heads = c.num_kv_heads * c.group;
  const int segments = c.num_sequences * c.num_kv_heads;
  std::uniform_int_distribution<int> length(0, c.max_length);
  std::vector<int32_t> lengths(segments);
  for (int32_t& l : lengths) l = length(rng);
  if (c.fixed_length > 0) lengths[0] = c.fixed_length;

  testing::HostKv cache(testing::kv_spec(c.num_kv_heads, c.head_dim, c.group), c.num_sequences,
                        c.page_size);
  testing::fill_cache(cache, lengths, rng);
  DeviceKvLayer kv(cache.layout, cache.pages, 0);

  std::normal_distribution<float> normal(0.0f, c.query_scale);
  std::vector<float> q(static_cast<size_t>(c.num_sequences) * num_q_heads * c.head_dim);
  for (float& x : q) x = testing::round_bf16(normal(rng));
  std::vector<uint16_t> q_bits(q.size());
  std::transform(q.begin(), q.end(), q_bits.begin(), f32_to_bf16);

  std::vector<int32_t> seq(c.num_sequences), pos(c.num_sequences, std::numeric_limits<int>::max());
  for (int s = 0; s < c.num_sequences; ++s) seq[s] = s;
  std::vector<float> expected(q.size());
  cpu::attention(cache.layout, cache.pages, 0, q.data(), seq.data(), pos.data(), c.num_sequences,
                 num_q_heads, expected.data());

  const DecodeAttentionShape shape{c.num_sequences, num_q_heads, c.num_kv_heads,
                                   c.head_dim,      c.page_size, c.with_scores};
  const DecodeAttentionPlan plan(shape, lengths);
  DeviceBuffer<uint8_t> schedule(plan.schedule_bytes()), scratch(plan.scratch_bytes());
  DeviceBuffer<uint16_t> q_device{std::span<const uint16_t>(q_bits)};
  // Poisoned with NaN: an element the kernels fail to write shows up.
  DeviceBuffer<uint16_t> out{std::span<const uint16_t>(std::vector<uint16_t>(q.size(), 0x7fc0))};
  DeviceBuffer<float> scores(c.with_scores ? static_cast<size_t>(kv.pool_rows()) : 0);
  plan.upload(schedule.data(), scratch.data(), nullptr);
  // Twice on one scratch: the second run relies on the first leaving its merge counters at zero.
  for (int run = 0; run < 2; ++run) {
    EKVA_CUDA_CHECK(cudaMemset(out.data(), 0xff, out.size() * sizeof(uint16_t)));  // NaN
    plan.run(kv.view(), q_device.data(), out.data(), c.with_scores ? scores.data() : nullptr,
             schedule.data(), scratch.data(), nullptr);
  }
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();

  double err2 = 0.0, ref2 = 0.0, max_ref = 0.0, max_err = 0.0;
  for (float x : expected) max_ref = std::max(max_ref, std::abs(static_cast<double>(x)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_f32(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "output element " << i << " not written";
    const double diff = g - expected[i];
    ASSERT_LE(std::abs(diff), 0.02 * max_ref + 1e-3)
        << "element " << i << ": got " << g << ", CPU " << expected[i];
    err2 += diff * diff;
    ref2 += static_cast<double>(expected[i]) * expected[i];
    max_err = std::max(max_err, std::abs(diff));
  }
  const double rel_rms = std::sqrt(err2 / std::max(ref2, 1e-30));
  EXPECT_LT(rel_rms, 1e-2);
  // In the XML report (--gtest_output=xml:FILE), so that kernel versions compare in precision.
  const std::string key = "seed_" + std::to_string(seed);
  ::testing::Test::RecordProperty(key + "_rel_rms_error", std::to_string(rel_rms));
  ::testing::Test::RecordProperty(key + "_max_error_over_max",
                                  std::to_string(max_err / std::max(max_ref, 1e-30)));

  if (c.with_scores) {
    const std::vector<float> got_scores = scores.download();
    for (int s = 0; s < c.num_sequences; ++s) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const std::vector<double> ref = reference_weights(cache, q, s, h, c.group);
        const HeadTable& t = cache.table(s, 0, h);
        for (int slot = 0; slot < t.size(); ++slot) {
          const double w =
              got_scores[static_cast<size_t>(t.pages[slot / c.page_size]) * c.page_size +
                         slot % c.page_size];
          ASSERT_NEAR(w, ref[slot], 2e-3 * ref[slot] + 1e-6)
              << "sequence " << s << " KV head " << h << " slot " << slot;
        }
      }
    }
  }
}

class DecodeAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { EKVA_SKIP_WITHOUT_GPU(); }
};

TEST_F(DecodeAttentionTest, RaggedAllShapesMatchCpu) {
  const bool small = testing::small_sizes();
  uint32_t seed = 1;
  for (int head_dim : {32, 64, 128}) {
    for (int group : {1, 2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim << " group " << group);
      const int batch = small ? 3 : 1 + static_cast<int>(seed * 7919 % 64);
      run_case({batch, 2, group, head_dim, 16, small ? 100 : 1500, 0, 1.0f, false}, seed++);
    }
  }
}

TEST_F(DecodeAttentionTest, OddPageSizeAndPeakedSoftmax) {
  const bool small = testing::small_sizes();
  run_case({small ? 3 : 29, 3, 4, 128, 7, small ? 90 : 999, 0, 6.0f, false}, 11);
  run_case({small ? 2 : 17, 1, 8, 64, 5, small ? 77 : 1777, 1, 4.0f, false}, 12);
}

TEST_F(DecodeAttentionTest, LongContext) {
  const bool small = testing::small_sizes();
  run_case({2, 1, 4, 128, 16, small ? 300 : 40000, small ? 1000 : 131072, 2.0f, false}, 21);
  run_case({1, 2, 8, 64, 16, small ? 300 : 100003, small ? 700 : 100003, 1.0f, false}, 22);
}

TEST_F(DecodeAttentionTest, FullBatchOfShortSequences) {
  const bool small = testing::small_sizes();
  run_case({small ? 8 : 64, 2, 4, 128, 16, small ? 20 : 300, 0, 1.0f, false}, 31);
}

// One segment split into more pieces than a merge round takes (32): at 2 tiles a CTA on an H200,
// 4224, 8192 and 12000 slots make 33, 64 and 94 pieces, merged in two, two and three rounds.
TEST_F(DecodeAttentionTest, SegmentOfManyPiecesMatchesCpu) {
  uint32_t seed = 51;
  for (int length : {4224, 8192, 12000}) {
    for (const auto& [group, head_dim] : {std::pair{4, 128}, {8, 64}, {2, 64}, {1, 32}}) {
      SCOPED_TRACE(::testing::Message()
                   << "length " << length << " group " << group << " head_dim " << head_dim);
      run_case({1, 1, group, head_dim, 16, 1, length, 1.0f, false}, seed++);
    }
  }
}

TEST_F(DecodeAttentionTest, FusedScoresMatchReferenceWeights) {
  const bool small = testing::small_sizes();
  run_case({small ? 3 : 9, 2, 4, 128, 16, small ? 150 : 3000, 0, 3.0f, true}, 41);
  run_case({small ? 2 : 5, 2, 8, 64, 16, small ? 150 : 2000, small ? 300 : 20000, 1.0f, true}, 42);
  run_case({3, 4, 1, 64, 8, 100, 0, 1.0f, true}, 43);
}

TEST_F(DecodeAttentionTest, RejectsMisalignedBuffers) {
  const std::vector<int32_t> lengths = {5, 7};
  std::mt19937 rng(51);
  testing::HostKv cache(testing::kv_spec(2, 128, 4), 1, 16);
  testing::fill_cache(cache, lengths, rng);
  DeviceKvLayer kv(cache.layout, cache.pages, 0);
  const DecodeAttentionPlan plan({1, 8, 2, 128, 16, false}, lengths);
  DeviceBuffer<uint8_t> schedule(plan.schedule_bytes() + 16), scratch(plan.scratch_bytes() + 16);
  uint8_t* const sch = schedule.data();
  uint8_t* const scr = scratch.data();
  DeviceBuffer<uint16_t> q(8 * 128 + 4), out(8 * 128 + 4);
  EKVA_CUDA_CHECK(cudaMemset(q.data(), 0, q.size() * sizeof(uint16_t)));
  const auto expect_rejected = [](const auto& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "expected ekva::Error for " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_rejected([&] { plan.upload(sch + 8, scr, nullptr); },
                  "the schedule must be 16-byte aligned");
  expect_rejected([&] { plan.upload(sch, scr + 8, nullptr); },
                  "the scratch must be 16-byte aligned");
  plan.upload(sch, scr, nullptr);
  expect_rejected(
      [&] { plan.run(kv.view(), q.data() + 1, out.data(), nullptr, sch, scr, nullptr); },
      "q must be 4-byte aligned");
  expect_rejected(
      [&] { plan.run(kv.view(), q.data(), out.data() + 2, nullptr, sch, scr, nullptr); },
      "out must be 8-byte aligned");
  expect_rejected(
      [&] { plan.run(kv.view(), q.data(), out.data(), nullptr, sch + 8, scr, nullptr); },
      "the schedule must be 16-byte aligned");
  expect_rejected(
      [&] { plan.run(kv.view(), q.data(), out.data(), nullptr, sch, scr + 8, nullptr); },
      "the scratch must be 16-byte aligned");
  PagedKvLayer shifted = kv.view();
  shifted.pool += 4;  // 8 bytes
  expect_rejected([&] { plan.run(shifted, q.data(), out.data(), nullptr, sch, scr, nullptr); },
                  "the pool must be 16-byte aligned");
  // Offsets that keep the alignment run.
  plan.run(kv.view(), q.data() + 2, out.data() + 4, nullptr, sch, scr, nullptr);
  EKVA_CUDA_CHECK(cudaDeviceSynchronize());
}

// Host-side checks: these run without a GPU too.
TEST(DecodeAttentionPlanTest, RejectsUnsupportedShapes) {
  EXPECT_TRUE(DecodeAttentionPlan::can_implement({4, 32, 8, 128, 16, false}));
  EXPECT_FALSE(DecodeAttentionPlan::can_implement({4, 32, 8, 96, 16, false}));
  EXPECT_FALSE(DecodeAttentionPlan::can_implement({4, 12, 4, 128, 16, false}));  // group 3
  EXPECT_FALSE(DecodeAttentionPlan::can_implement({4, 30, 8, 128, 16, false}));  // not divisible
  EXPECT_FALSE(DecodeAttentionPlan::can_implement({0, 32, 8, 128, 16, false}));
  // Validation comes before any device query, so this holds without a GPU too.
  const std::vector<int32_t> lengths(4 * 4, 10);
  try {
    DecodeAttentionPlan({4, 12, 4, 96, 16, false}, lengths);
    FAIL() << "expected ekva::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("head_dim 96"), std::string::npos) << e.what();
  }
}

// Every slot of every segment in exactly one piece, a segment's pieces consecutive and
// tile-aligned, no CTA over the quota (tiles plus the cost of each piece after its first) but a
// one-piece CTA by the segment's last tile where that tile would be the segment's (32k + 1)-th
// piece, every CTA but the last closed only when the next piece's first tile would not fit, and
// the quota no less than the even share of the tiles.
void check_schedule(const std::vector<int32_t>& lengths, int64_t grid_ctas) {
  SCOPED_TRACE(::testing::Message() << lengths.size() << " segments, grid " << grid_ctas);
  constexpr int kTile = 64;
  const DecodeSchedule schedule = make_decode_schedule(lengths, grid_ctas);
  const auto tiles = [](int64_t slots) { return (slots + kTile - 1) / kTile; };
  int64_t total_tiles = 0;
  for (const int32_t l : lengths) total_tiles += tiles(l);
  const int64_t quota = schedule.quota_tiles;
  EXPECT_GE(quota, std::max<int64_t>(2, (total_tiles + grid_ctas - 1) / grid_ctas));

  ASSERT_EQ(schedule.segment_piece_offsets.size(), lengths.size() + 1);
  ASSERT_EQ(schedule.segment_token_offsets.size(), lengths.size() + 1);
  EXPECT_EQ(schedule.segment_piece_offsets.front(), 0);
  EXPECT_EQ(schedule.segment_piece_offsets.back(), schedule.num_pieces());
  int64_t tokens = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    EXPECT_EQ(schedule.segment_token_offsets[s], tokens);
    tokens += lengths[s];
    const int first = schedule.segment_piece_offsets[s];
    const int last = schedule.segment_piece_offsets[s + 1];
    ASSERT_LT(first, last) << "segment " << s << " has no piece";
    int32_t covered = 0;
    for (int i = first; i < last; ++i) {
      const int32_t* piece = &schedule.pieces[static_cast<size_t>(i) * 4];
      EXPECT_EQ(piece[0], static_cast<int32_t>(s));
      EXPECT_EQ(piece[1], covered) << "piece " << i;
      EXPECT_EQ(piece[1] % kTile, 0) << "piece " << i;
      EXPECT_TRUE(piece[2] > piece[1] || (lengths[s] == 0 && piece[2] == 0)) << "piece " << i;
      covered = piece[2];
    }
    EXPECT_EQ(covered, lengths[s]) << "segment " << s;
    if (lengths[s] == 0) {
      EXPECT_EQ(last - first, 1);
    }
  }
  EXPECT_EQ(schedule.segment_token_offsets.back(), tokens);

  ASSERT_GE(schedule.num_ctas(), 1);
  EXPECT_LE(schedule.num_ctas(), grid_ctas);
  // The bound DecodeAttentionPlan sizes its schedule by.
  EXPECT_LE(schedule.num_pieces(), static_cast<int64_t>(lengths.size()) + grid_ctas);
  EXPECT_EQ(schedule.cta_piece_offsets.front(), 0);
  EXPECT_EQ(schedule.cta_piece_offsets.back(), schedule.num_pieces());
  for (int c = 0; c < schedule.num_ctas(); ++c) {
    ASSERT_LT(schedule.cta_piece_offsets[c], schedule.cta_piece_offsets[c + 1]) << "CTA " << c;
    int64_t cost = 0;
    for (int i = schedule.cta_piece_offsets[c]; i < schedule.cta_piece_offsets[c + 1]; ++i) {
      const int64_t piece_tiles = tiles(schedule.pieces[static_cast<size_t>(i) * 4 + 2] -
                                        schedule.pieces[static_cast<size_t>(i) * 4 + 1]);
      if (i > schedule.cta_piece_offsets[c]) cost += DecodeSchedule::kPieceEndTiles;
      cost += piece_tiles;
    }
    const int first = schedule.cta_piece_offsets[c];
    const int segment = schedule.pieces[static_cast<size_t>(first) * 4];
    const bool takes_last_tile =
        schedule.cta_piece_offsets[c + 1] == first + 1 &&
        schedule.pieces[static_cast<size_t>(first) * 4 + 2] == lengths[segment] &&
        (first + 1 - schedule.segment_piece_offsets[segment]) % kDecodeMergeBatch == 0;
    EXPECT_LE(cost, takes_last_tile ? quota + 1 : quota) << "CTA " << c;
    if (c + 1 < schedule.num_ctas()) {
      EXPECT_GE(cost + DecodeSchedule::kPieceEndTiles, quota) << "CTA " << c;
    }
  }
}

TEST(DecodeAttentionPlanTest, ScheduleCoversEverySlotWithinTheQuota) {
  std::mt19937 rng(5);
  check_schedule({4096, 4096, 4096, 4096}, 264);
  // A 4096-token context and the step's token: 65 tiles a segment at quota 2 make 32 pieces, the
  // last of three tiles, so that the merge loads them in one round.
  const std::vector<int32_t> one_more(4, 4097);
  check_schedule(one_more, 132);
  const DecodeSchedule merged_once = make_decode_schedule(one_more, 132);
  EXPECT_EQ(merged_once.quota_tiles, 2);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(merged_once.segment_piece_offsets[s + 1] - merged_once.segment_piece_offsets[s],
              kDecodeMergeBatch);
  }
  check_schedule({0, 0, 0}, 264);
  // A server's idle sequences: many empty segments beside a few long ones spread over the grid.
  std::vector<int32_t> idle(296, 0);
  idle[280] = idle[290] = 4160;
  check_schedule(idle, 528);
  EXPECT_GT(make_decode_schedule(idle, 528).num_ctas(), 40);
  check_schedule({1, 63, 64, 65, 0, 127, 128, 129}, 3);
  check_schedule({131072}, 264);
  for (const int max_length : {5, 200, 5000, 70000}) {
    for (const int64_t grid : {1, 7, 132, 264}) {
      std::uniform_int_distribution<int> length(0, max_length);
      std::vector<int32_t> lengths(1 + rng() % 300);
      for (int32_t& l : lengths) l = length(rng);
      check_schedule(lengths, grid);
    }
  }
  EXPECT_THROW(make_decode_schedule(std::vector<int32_t>{10}, 0), Error);
  EXPECT_THROW(make_decode_schedule(std::vector<int32_t>{10, -1}, 4), Error);
  // The pieces and the logits scratch count slots in 32 bits.
  EXPECT_THROW(
      make_decode_schedule(std::vector<int32_t>{std::numeric_limits<int32_t>::max(), 1}, 4), Error);
}

// A captured step replays with the next step's schedule in the same place: the layout is the
// shape's, whatever the lengths, and CTAs the schedule leaves idle start at its end.
TEST(DecodeAttentionPlanTest, ScheduleLayoutDependsOnTheShapeAlone) {
  const DecodeAttentionShape shape{3, 8, 2, 128, 16, false};
  const int64_t grid = 40;
  const DecodeAttentionPlan short_plan(shape, std::vector<int32_t>{1, 0, 5, 9, 2, 3}, grid);
  const DecodeAttentionPlan long_plan(shape, std::vector<int32_t>{4096, 70, 9000, 1, 0, 300}, grid);
  EXPECT_EQ(short_plan.schedule_bytes(), long_plan.schedule_bytes());
  EXPECT_EQ(short_plan.scratch_bytes(), long_plan.scratch_bytes());  // no scores: no logits
  EXPECT_EQ(short_plan.schedule_bytes() % 256, 0u);
  for (const DecodeAttentionPlan* plan : {&short_plan, &long_plan}) {
    const std::span<const int32_t> starts = plan->schedule();
    ASSERT_GE(starts.size(), static_cast<size_t>(4 * (grid + 1)));
    for (int64_t c = 0; c <= grid; ++c) {
      const int32_t first = starts[4 * c + 3];
      EXPECT_EQ(c >= plan->num_ctas(), first == plan->num_pieces()) << "CTA " << c;
    }
  }
  EXPECT_LT(short_plan.num_ctas(), long_plan.num_ctas());
}

TEST(DecodeAttentionPlanTest, DispatchThrowsOnUnsupportedValues) {
  int seen = 0;
  dispatch_decode_shape(
      128, 4, [&](auto d, auto g) { seen = decltype(d)::value * 10 + decltype(g)::value; });
  EXPECT_EQ(seen, 1284);
  const auto nothing = [](auto, auto) {};
  EXPECT_THROW(dispatch_decode_shape(96, 4, nothing), Error);
  EXPECT_THROW(dispatch_decode_shape(128, 3, nothing), Error);
}

TEST(CudaCheckTest, ThrowsErrorNamingCallFileAndLine) {
  try {
    EKVA_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "expected ekva::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(what.find("decode_attention_test.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(EKVA_CUDA_CHECK(cudaSuccess));
}

}  // namespace
}  // namespace ekva::cuda
