// The device expert path of small steps (pairs sorted by expert, the grouped product on the tensor
// cores) against products computed here in double, on sizes that are not multiples of its tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/model_ops.h"
#include "core/error.h"
#include "paged_kv_fixture.h"

namespace ekva::cuda {
namespace {

struct Case {
  int num_experts;
  int top_k;
  int tokens;
  int out_rows;
  int in_cols;
};

std::vector<uint16_t> random_bf16(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<uint16_t> x(count);
  for (uint16_t& v : x) v = f32_to_bf16(value(rng));
  return x;
}

// The order and the groups MoePairs promises, built here by a stable sort of the pairs by expert.
void expect_sorted_like_reference(const std::vector<int32_t>& experts,
                                  const std::vector<float>& gates, const Case& c,
                                  const std::vector<int32_t>& ints,
                                  const std::vector<float>& sorted_gates) {
  const int pairs = c.tokens * c.top_k;
  std::vector<int> order(pairs);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return experts[a] < experts[b]; });
  std::vector<int32_t> token_pairs(pairs), group_expert, group_first;
  for (int slot = 0; slot < pairs; ++slot) {
    const int j = order[slot];
    ASSERT_EQ(ints[slot], j / c.top_k) << "token of slot " << slot;
    ASSERT_EQ(ints[pairs + slot], experts[j]) << "expert of slot " << slot;
    ASSERT_EQ(sorted_gates[slot], gates[j]) << "gate of slot " << slot;
    // A group opens at each expert's first pair and after each group's worth of its pairs.
    if (slot == 0 || experts[order[slot - 1]] != experts[j] ||
        slot - group_first.back() == moe_group_tokens(c.tokens, c.top_k, c.num_experts)) {
      group_expert.push_back(experts[j]);
      group_first.push_back(slot);
    }
  }
  std::vector<std::vector<int>> token_slots(c.tokens);
  for (int slot = 0; slot < pairs; ++slot) {
    token_slots[order[slot] / c.top_k].push_back(slot);  // ascending expert already
  }
  for (int t = 0; t < c.tokens; ++t) {
    for (int i = 0; i < c.top_k; ++i) {
      ASSERT_EQ(ints[2 * pairs + t * c.top_k + i], token_slots[t][i])
          << "token " << t << " pair " << i;
    }
  }
  const int num_groups = static_cast<int>(group_expert.size());
  ASSERT_EQ(ints[5 * pairs + 1], num_groups);
  for (int i = 0; i < num_groups; ++i) {
    EXPECT_EQ(ints[3 * pairs + i], group_expert[i]);
    EXPECT_EQ(ints[4 * pairs + i], group_first[i]);
  }
  EXPECT_EQ(ints[4 * pairs + num_groups], pairs);
}

// Each token's top_k distinct experts, drawn from a window of a few at a random place so that
// experts share tokens and some are not touched. Distinct gates show where each pair went.
void random_routing(const Case& c, std::mt19937& rng, std::vector<int32_t>& experts,
                    std::vector<float>& gates) {
  const int pairs = c.tokens * c.top_k;
  experts.resize(pairs);
  gates.resize(pairs);
  for (int j = 0; j < pairs; ++j) gates[j] = 1.0f / static_cast<float>(j + 2);
  const int window = std::min(c.num_experts, 2 * c.top_k + 1);
  std::vector<int32_t> ids(window);
  for (int t = 0; t < c.tokens; ++t) {
    const int base = static_cast<int>(rng() % static_cast<uint32_t>(c.num_experts - window + 1));
    std::iota(ids.begin(), ids.end(), base);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy_n(ids.begin(), c.top_k, experts.begin() + static_cast<size_t>(t) * c.top_k);
  }
}

void run_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int pairs = c.tokens * c.top_k;
  std::vector<int32_t> experts;
  std::vector<float> gates;
  random_routing(c, rng, experts, gates);
  std::vector<std::vector<uint16_t>> weights;
  std::vector<DeviceBuffer<uint16_t>> weights_device;
  std::vector<const uint16_t*> pointers;
  for (int e = 0; e < c.num_experts; ++e) {
    weights.push_back(random_bf16(static_cast<size_t>(c.out_rows) * c.in_cols, rng));
    weights_device.emplace_back(std::span<const uint16_t>(weights.back()));
    pointers.push_back(weights_device.back().data());
  }
  const std::vector<uint16_t> tokens = random_bf16(static_cast<size_t>(c.tokens) * c.in_cols, rng);
  const std::vector<uint16_t> pair_rows = random_bf16(static_cast<size_t>(pairs) * c.in_cols, rng);

  DeviceBuffer<const uint16_t*> pointers_device{std::span<const uint16_t* const>(pointers)};
  DeviceBuffer<int32_t> experts_device{std::span<const int32_t>(experts)};
  DeviceBuffer<float> gates_device{std::span<const float>(gates)};
  DeviceBuffer<int32_t> ints(moe_pair_ints(pairs));
  DeviceBuffer<float> pair_gates(pairs);
  const MoePairs p = moe_pairs(ints.data(), pair_gates.data(), pairs);
  sort_pairs(experts_device.data(), gates_device.data(), c.tokens, c.top_k, c.num_experts, p,
             nullptr);
  expect_sorted_like_reference(experts, gates, c, ints.download(), pair_gates.download());
  DeviceBuffer<uint16_t> tokens_device{std::span<const uint16_t>(tokens)};
  DeviceBuffer<uint16_t> pair_rows_device{std::span<const uint16_t>(pair_rows)};
  for (const bool input_is_token : {true, false}) {
    SCOPED_TRACE(input_is_token ? "token inputs" : "pair inputs");
    DeviceBuffer<float> out(static_cast<size_t>(pairs) * c.out_rows);
    EKVA_CUDA_CHECK(cudaMemset(out.data(), 0xff, out.bytes()));  // NaN: unwritten outputs show
    GroupedGemm g;
    g.weights = pointers_device.data();
    g.input = input_is_token ? tokens_device.data() : pair_rows_device.data();
    g.input_is_token = input_is_token;
    g.out = out.data();
    g.out_rows = c.out_rows;
    g.in_cols = c.in_cols;
    grouped_gemm(g, p, c.tokens, c.top_k, c.num_experts, nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = out.download();
    const std::vector<int32_t> sorted = ints.download();
    std::vector<double> want(got.size()), magnitude(got.size());
    for (int j = 0; j < pairs; ++j) {
      const int token = sorted[j], expert = sorted[pairs + j];
      const uint16_t* x = input_is_token ? tokens.data() + static_cast<size_t>(token) * c.in_cols
                                         : pair_rows.data() + static_cast<size_t>(j) * c.in_cols;
      for (int r = 0; r < c.out_rows; ++r) {
        const uint16_t* w = weights[expert].data() + static_cast<size_t>(r) * c.in_cols;
        const size_t at = static_cast<size_t>(j) * c.out_rows + r;
        for (int i = 0; i < c.in_cols; ++i) {
          const double term = static_cast<double>(bf16_to_f32(w[i])) * bf16_to_f32(x[i]);
          want[at] += term;
          magnitude[at] += std::abs(term);
        }
        // fp32 accumulation of in_cols products.
        ASSERT_NEAR(got[at], want[at], 1e-5 * magnitude[at] + 1e-6)
            << "pair " << j << " (token " << token << ", expert " << expert << ") row " << r;
      }
    }
    if (!input_is_token) continue;

    // The product as a gate-and-up one (the first half of the rows gates, the second is up):
    // silu_mul forms bf16(silu(gate) * up) of each pair's row.
    if (c.out_rows % 2 == 0) {
      const int inter = c.out_rows / 2;
      DeviceBuffer<uint16_t> h(static_cast<size_t>(pairs) * inter);
      silu_mul(out.data(), pairs, inter, h.data(), nullptr);
      EKVA_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got_h = h.download();
      for (int j = 0; j < pairs; ++j) {
        for (int r = 0; r < inter; ++r) {
          const size_t gate = static_cast<size_t>(j) * c.out_rows + r, up = gate + inter;
          const float want_h = got[gate] / (1.0f + std::exp(-got[gate])) * got[up];
          // The device's expf may differ from the host's in the last place: one bf16 step.
          ASSERT_NEAR(bf16_to_f32(got_h[static_cast<size_t>(j) * inter + r]), want_h,
                      std::abs(want_h) / 128)
              << "SwiGLU of pair " << j << " row " << r;
        }
      }
      // Wide groups' product applies the SwiGLU itself, to sums of its own: unsplit, where the
      // float32 product above may have been cut along its columns (sums in another order).
      if (moe_group_tokens(c.tokens, c.top_k, c.num_experts) == kWideGroupTokens) {
        DeviceBuffer<uint16_t> fused(static_cast<size_t>(pairs) * inter);
        GroupedGemm swiglu = g;
        swiglu.out = nullptr;
        swiglu.swiglu_out = fused.data();
        grouped_gemm(swiglu, p, c.tokens, c.top_k, c.num_experts, nullptr);
        EKVA_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> got_fused = fused.download();
        for (int j = 0; j < pairs; ++j) {
          for (int r = 0; r < inter; ++r) {
            const size_t gate = static_cast<size_t>(j) * c.out_rows + r, up = gate + inter;
            const double g_sum = want[gate], u_sum = want[up];
            const double want_h = g_sum / (1.0 + std::exp(-g_sum)) * u_sum;
            // One bf16 step, and the float32 sums' error carried through silu(g) * u.
            const double bound =
                std::abs(want_h) / 128 +
                1.1e-5 * (std::abs(u_sum) * magnitude[gate] + std::abs(g_sum) * magnitude[up]) +
                1e-6;
            ASSERT_NEAR(bf16_to_f32(got_fused[static_cast<size_t>(j) * inter + r]), want_h, bound)
                << "fused SwiGLU of pair " << j << " row " << r;
          }
        }
      }
    }

    // The gated sum of each token's pairs' outputs in ascending expert order, one expert (the
    // first token's second) left out wherever it was picked.
    const std::vector<float> sorted_gates = pair_gates.download();
    DeviceBuffer<float> combined(static_cast<size_t>(c.tokens) * c.out_rows);
    const int disabled = experts[std::min(1, c.top_k - 1)];
    combine_pairs(out.data(), p, c.tokens, c.top_k, c.out_rows, disabled, combined.data(), nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    // got_sums against the gated sums of each token's rows y(pair, row) in double precision.
    const auto expect_gated_sums = [&](const std::vector<float>& got_sums, const auto& y,
                                       const char* what) {
      for (int t = 0; t < c.tokens; ++t) {
        for (int r = 0; r < c.out_rows; ++r) {
          double sum = 0.0, scale = 0.0;
          for (int i = 0; i < c.top_k; ++i) {
            const int j = sorted[2 * pairs + t * c.top_k + i];
            if (sorted[pairs + j] == disabled) continue;
            const double value = y(j, r);
            sum += static_cast<double>(sorted_gates[j]) * value;
            scale += std::abs(value);
          }
          ASSERT_NEAR(got_sums[static_cast<size_t>(t) * c.out_rows + r], sum, 1e-6 * scale + 1e-7)
              << "token " << t << " row " << r << " of " << what;
        }
      }
    };
    expect_gated_sums(
        combined.download(),
        [&](int j, int r) { return got[static_cast<size_t>(j) * c.out_rows + r]; },
        "the float32 rows' sum");

    // Wide groups' product with bf16 output rows (unsplit), and their gated sum.
    if (moe_group_tokens(c.tokens, c.top_k, c.num_experts) == kWideGroupTokens) {
      DeviceBuffer<uint16_t> rows(static_cast<size_t>(pairs) * c.out_rows);
      EKVA_CUDA_CHECK(cudaMemset(rows.data(), 0xff, rows.bytes()));  // NaN: unwritten rows show
      GroupedGemm rounded = g;
      rounded.out = nullptr;
      rounded.out_bf16 = rows.data();
      grouped_gemm(rounded, p, c.tokens, c.top_k, c.num_experts, nullptr);
      combine_pairs(rows.data(), p, c.tokens, c.top_k, c.out_rows, disabled, combined.data(), {},
                    nullptr);
      EKVA_CUDA_CHECK(cudaDeviceSynchronize());
      // The same sum added to a residual and normalised in the same kernel: bit for bit what
      // add_rms_norm gives after it (one expression forms each element; only the order of the
      // double sum of squares differs).
      {
        std::uniform_real_distribution<float> value(-1.0f, 1.0f);
        std::vector<float> residual(static_cast<size_t>(c.tokens) * c.out_rows), norm_w(c.out_rows);
        for (float& v : residual) v = value(rng);
        for (float& v : norm_w) v = 1.0f + 0.5f * value(rng);
        DeviceBuffer<float> separate{std::span<const float>(residual)},
            fused{std::span<const float>(residual)}, norm_d{std::span<const float>(norm_w)};
        DeviceBuffer<uint16_t> separate_bf16(residual.size()), fused_bf16(residual.size());
        constexpr float kEps = 1e-6f;
        add_rms_norm(separate.data(), combined.data(), c.tokens, c.out_rows, norm_d.data(), kEps,
                     nullptr, separate_bf16.data(), nullptr);
        combine_pairs(rows.data(), p, c.tokens, c.top_k, c.out_rows, disabled, fused.data(),
                      ResidualNorm{norm_d.data(), kEps, fused_bf16.data()}, nullptr);
        EKVA_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(fused.download(), separate.download());
        EXPECT_EQ(fused_bf16.download(), separate_bf16.download());
      }
      const std::vector<uint16_t> got_rows = rows.download();
      for (size_t at = 0; at < got_rows.size(); ++at) {
        // One bf16 rounding of a float32 sum.
        ASSERT_NEAR(bf16_to_f32(got_rows[at]), want[at],
                    std::abs(want[at]) / 256 + 1.1e-5 * magnitude[at] + 1e-6)
            << "bf16 row element " << at;
      }
      expect_gated_sums(
          combined.download(),
          [&](int j, int r) {
            return bf16_to_f32(got_rows[static_cast<size_t>(j) * c.out_rows + r]);
          },
          "the bf16 rows' sum");
    }
  }
}

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { EKVA_SKIP_WITHOUT_GPU(); }
};

// One token: each expert's product is a GEMV (gemv_kernel), columns past whole column steps, with
// 1, 4, 8 and 2 warps sharing each row (a warp per row keeps eight 16-byte loads in flight per
// lane; warps share a row when the rows are few and the columns many).
TEST_F(GroupedGemmTest, OneTokenManyColumns) {
  run_case({8, 2, 1, 200, 3000}, 1);
  run_case({8, 2, 1, 200, 8200}, 2);
  run_case({8, 2, 1, 33, 16392}, 7);
  run_case({4, 1, 1, 70, 4104}, 8);
}

TEST_F(GroupedGemmTest, OneTokenFineGrainedOddSizes) {
  run_case({128, 8, 1, 97, 520}, 6);
}

TEST_F(GroupedGemmTest, FullBatchOfTokensSharingExperts) {
  run_case({16, 4, kMaxGroupedTokens, 72, 136}, 2);
}

// Few CTAs over many columns: the product is cut along its columns, the parts added atomically.
TEST_F(GroupedGemmTest, ColumnSplitProductsOfManyTokens) {
  run_case({4, 1, 70, 48, 1000}, 14);
}

// A top-k beyond what combine_pairs holds per token is refused before anything is launched.
TEST_F(GroupedGemmTest, CombineRefusesTopKAbove32) {
  const float* rows = nullptr;
  const uint16_t* bf16_rows = nullptr;
  EXPECT_THROW(combine_pairs(rows, MoePairs{}, 1, 33, 64, -1, nullptr, nullptr), Error);
  EXPECT_THROW(combine_pairs(rows, MoePairs{}, 1, 0, 64, -1, nullptr, nullptr), Error);
  EXPECT_THROW(combine_pairs(bf16_rows, MoePairs{}, 1, 33, 64, -1, nullptr, {}, nullptr), Error);
  // A norm needs its bf16 output.
  const float norm_weight = 1.0f;
  EXPECT_THROW(combine_pairs(bf16_rows, MoePairs{}, 1, 2, 64, -1, nullptr,
                             ResidualNorm{&norm_weight, 1e-6f, nullptr}, nullptr),
               Error);
}

TEST_F(GroupedGemmTest, FineGrainedExpertsOddSizes) {
  run_case({128, 8, 5, 97, 520}, 3);
}

TEST_F(GroupedGemmTest, MostExpertsFullBatchTopEight) {
  run_case({kMaxGroupedExperts, 8, kMaxGroupedTokens, 24, 64}, 5);
}

// More tokens than a group holds: experts of several groups, the last one partial, and 1200 pairs
// (runs of 38 pairs per warp of the sort: a partial round each).
TEST_F(GroupedGemmTest, StepsOfManyGroups) {
  run_case({8, 2, 300, 40, 136}, 10);
  run_case({128, 8, 150, 24, 64}, 11);
  run_case({4, 1, kMaxGroupedTokens * 3 + 1, 33, 72}, 12);
}

// The pairs of prompts sorted alone (their products take too long here in double): fine-grained
// experts with runs of 1024 pairs per warp of the sort, a coarse model's wide groups, and a run
// that ends inside a round.
TEST_F(GroupedGemmTest, SortOfPromptSizedSteps) {
  for (const Case& c :
       {Case{128, 8, 4096, 0, 0}, Case{64, 8, 4000, 0, 0}, Case{8, 2, 4093, 0, 0}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.tokens << " tokens, top-" << c.top_k << " of " << c.num_experts);
    std::mt19937 rng(static_cast<uint32_t>(c.tokens));
    std::vector<int32_t> experts;
    std::vector<float> gates;
    random_routing(c, rng, experts, gates);
    const int pairs = c.tokens * c.top_k;
    DeviceBuffer<int32_t> experts_device{std::span<const int32_t>(experts)};
    DeviceBuffer<float> gates_device{std::span<const float>(gates)};
    DeviceBuffer<int32_t> ints(moe_pair_ints(pairs));
    DeviceBuffer<float> pair_gates(pairs);
    const MoePairs p = moe_pairs(ints.data(), pair_gates.data(), pairs);
    sort_pairs(experts_device.data(), gates_device.data(), c.tokens, c.top_k, c.num_experts, p,
               nullptr);
    expect_sorted_like_reference(experts, gates, c, ints.download(), pair_gates.download());
  }
}

// Steps whose experts average a group of kMaxGroupedTokens or more take groups of
// kWideGroupTokens on the wide kernel (four consumer warpgroups), with and without the SwiGLU
// applied: weight rows past a tile (130 and 136 rows: gate and up halves of 65 and 68), columns
// past a stage, more column steps than stages, groups with tokens for only some of the warps, and
// a step of each group size either side of the threshold.
TEST_F(GroupedGemmTest, WideGroupsOfPromptSizedSteps) {
  ASSERT_EQ(moe_group_tokens(1000, 1, 4), kWideGroupTokens);
  run_case({4, 1, 1000, 200, 328}, 15);
  run_case({16, 2, 700, 136, 1000}, 16);
  run_case({4, 1, 1000, 203, 136}, 20);  // rows of an odd length: combine's columns one by one
  ASSERT_EQ(moe_group_tokens(255, 1, 4), kMaxGroupedTokens);
  ASSERT_EQ(moe_group_tokens(256, 1, 4), kWideGroupTokens);
  run_case({4, 1, 255, 130, 72}, 17);
  run_case({4, 1, 256, 130, 72}, 18);
}

// More tiles than a GPU has multiprocessors (about 70 groups of 8 experts, three row tiles each):
// the persistent wide kernel's CTAs take several tiles, its producer copying a tile's stages
// while the consumers still store the last one's rows, and a tile's three column steps leave the
// stages' phases mid-cycle for the next.
TEST_F(GroupedGemmTest, WideGroupsOfMoreTilesThanMultiprocessors) {
  ASSERT_EQ(moe_group_tokens(4000, 2, 8), kWideGroupTokens);
  run_case({8, 2, 4000, 520, 136}, 19);
}

// A one-token step's gate-and-up product with its SwiGLU applied (bf16 out), and its down product
// gated and added over the token's experts in ascending order (one expert disabled), against
// products here in double; few expert rows of many columns make warps share the gate-and-up rows
// (48 x 4104), few hidden rows of many columns the down rows at top-2 (4104 x 40).
TEST_F(GroupedGemmTest, OneTokenSwigluAndCombinedProducts) {
  std::mt19937 rng(9);
  constexpr int kExperts = 16;
  for (const auto [kInter, kHidden, top_k] :
       {std::array{1032, 1040, 2}, std::array{1032, 1040, 8}, std::array{48, 4104, 2},
        std::array{48, 4104, 8}, std::array{4104, 40, 2}}) {
    SCOPED_TRACE(::testing::Message() << "top-" << top_k << ", " << kInter << " x " << kHidden);
    std::vector<int32_t> experts(top_k);
    std::iota(experts.begin(), experts.end(), 3);
    std::shuffle(experts.begin(), experts.end(), rng);
    std::vector<float> gates(top_k);
    for (int j = 0; j < top_k; ++j) gates[j] = 1.0f / static_cast<float>(j + 2);
    const int disabled = experts[top_k / 2];
    std::vector<std::vector<uint16_t>> up_w, down_w;
    std::vector<DeviceBuffer<uint16_t>> device_w;
    std::vector<const uint16_t*> up_ptrs, down_ptrs;
    for (int e = 0; e < kExperts; ++e) {
      up_w.push_back(random_bf16(static_cast<size_t>(2 * kInter) * kHidden, rng));
      device_w.emplace_back(std::span<const uint16_t>(up_w.back()));
      up_ptrs.push_back(device_w.back().data());
      down_w.push_back(random_bf16(static_cast<size_t>(kHidden) * kInter, rng));
      device_w.emplace_back(std::span<const uint16_t>(down_w.back()));
      down_ptrs.push_back(device_w.back().data());
    }
    const std::vector<uint16_t> x = random_bf16(kHidden, rng);
    DeviceBuffer<const uint16_t*> up_d{std::span<const uint16_t* const>(up_ptrs)};
    DeviceBuffer<const uint16_t*> down_d{std::span<const uint16_t* const>(down_ptrs)};
    DeviceBuffer<uint16_t> x_d{std::span<const uint16_t>(x)};
    DeviceBuffer<int32_t> experts_d{std::span<const int32_t>(experts)};
    DeviceBuffer<float> gates_d{std::span<const float>(gates)};
    DeviceBuffer<int32_t> ints(moe_pair_ints(top_k));
    DeviceBuffer<float> pair_gates(top_k);
    const MoePairs p = moe_pairs(ints.data(), pair_gates.data(), top_k);
    sort_pairs(experts_d.data(), gates_d.data(), 1, top_k, kExperts, p, nullptr);
    DeviceBuffer<uint16_t> h(static_cast<size_t>(top_k) * kInter);
    DeviceBuffer<float> out(kHidden);
    EKVA_CUDA_CHECK(cudaMemset(out.data(), 0xff, out.bytes()));
    GroupedGemm up;
    up.weights = up_d.data();
    up.input = x_d.data();
    up.input_is_token = true;
    up.out_rows = 2 * kInter;
    up.in_cols = kHidden;
    up.swiglu_out = h.data();
    grouped_gemm(up, p, 1, top_k, kExperts, nullptr);
    GroupedGemm down;
    down.weights = down_d.data();
    down.input = h.data();
    down.out_rows = kHidden;
    down.in_cols = kInter;
    ASSERT_TRUE(combined_gemv_supported(1, top_k));
    grouped_gemm_combined(down, p, top_k, disabled, out.data(), nullptr);
    EKVA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got_h = h.download();
    const std::vector<float> got = out.download();
    std::vector<int32_t> sorted = experts;
    std::sort(sorted.begin(), sorted.end());
    const auto dot = [](const uint16_t* w, const uint16_t* v, int n, double* magnitude) {
      double sum = 0.0;
      for (int i = 0; i < n; ++i) {
        const double term = static_cast<double>(bf16_to_f32(w[i])) * bf16_to_f32(v[i]);
        sum += term;
        *magnitude += std::abs(term);
      }
      return sum;
    };
    for (int j = 0; j < top_k; ++j) {  // pair j is the j-th smallest expert
      const int e = sorted[j];
      for (int r = 0; r < kInter; ++r) {
        double mg = 0.0, mu = 0.0;
        const double g =
            dot(up_w[e].data() + static_cast<size_t>(r) * kHidden, x.data(), kHidden, &mg);
        const double u =
            dot(up_w[e].data() + static_cast<size_t>(kInter + r) * kHidden, x.data(), kHidden, &mu);
        const double want = g / (1.0 + std::exp(-g)) * u;
        // bf16 rounding of the result, and fp32 sums of the two products.
        ASSERT_NEAR(bf16_to_f32(got_h[static_cast<size_t>(j) * kInter + r]), want,
                    std::abs(want) / 128 + 1e-5 * (mg + mu))
            << "pair " << j << " (expert " << e << ") row " << r;
      }
    }
    for (int r = 0; r < kHidden; ++r) {
      double want = 0.0, magnitude = 0.0;
      for (int j = 0; j < top_k; ++j) {
        if (sorted[j] == disabled) continue;
        const size_t gate_index =
            std::find(experts.begin(), experts.end(), sorted[j]) - experts.begin();
        double m = 0.0;
        want += gates[gate_index] * dot(down_w[sorted[j]].data() + static_cast<size_t>(r) * kInter,
                                        got_h.data() + static_cast<size_t>(j) * kInter, kInter, &m);
        magnitude += gates[gate_index] * m;
      }
      ASSERT_NEAR(got[r], want, 1e-5 * magnitude + 1e-6) << "row " << r;
    }
  }
  EXPECT_FALSE(combined_gemv_supported(2, 2));
  EXPECT_FALSE(combined_gemv_supported(1, 6));
}

// Also as a stacked [Q; K; V]-like matrix (a first block of 140 rows, then blocks of 80: tiles of
// 64 rows cross both boundaries), each block's outputs in an array of its own.
TEST_F(GroupedGemmTest, SkinnyDenseProductMatchesDouble) {
  std::mt19937 rng(4);
  constexpr int kFirst = 140, kBlock = 80;
  for (const bool blocks : {false, true}) {
    for (const int n : {1, 7, kMaxGroupedTokens}) {
      const int out_rows = kFirst + 2 * kBlock, in_cols = 1000;
      const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(out_rows) * in_cols, rng);
      const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(n) * in_cols, rng);
      DeviceBuffer<uint16_t> w_device{std::span<const uint16_t>(w)};
      DeviceBuffer<uint16_t> x_device{std::span<const uint16_t>(x)};
      DeviceBuffer<float> y(static_cast<size_t>(n) * out_rows);
      EKVA_CUDA_CHECK(cudaMemset(y.data(), 0xff, y.bytes()));
      if (blocks) {
        skinny_gemm_blocks(x_device.data(), n, w_device.data(), kFirst, kBlock, out_rows, in_cols,
                           y.data(), nullptr);
      } else {
        skinny_gemm(x_device.data(), n, w_device.data(), out_rows, in_cols, y.data(), nullptr);
      }
      EKVA_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = y.download();
      const auto at = [&](int t, int r) -> size_t {
        if (!blocks) return static_cast<size_t>(t) * out_rows + r;
        if (r < kFirst) return static_cast<size_t>(t) * kFirst + r;
        const int b = (r - kFirst) / kBlock;
        return static_cast<size_t>(n) * (kFirst + b * kBlock) + static_cast<size_t>(t) * kBlock +
               (r - kFirst - b * kBlock);
      };
      for (int t = 0; t < n; ++t) {
        for (int r = 0; r < out_rows; ++r) {
          double want = 0.0, magnitude = 0.0;
          for (int i = 0; i < in_cols; ++i) {
            const double term =
                static_cast<double>(bf16_to_f32(w[static_cast<size_t>(r) * in_cols + i])) *
                bf16_to_f32(x[static_cast<size_t>(t) * in_cols + i]);
            want += term;
            magnitude += std::abs(term);
          }
          ASSERT_NEAR(got[at(t, r)], want, 1e-5 * magnitude + 1e-6)
              << n << " rows, blocks " << blocks << ": row " << t << " output " << r;
        }
      }
    }
  }
}

TEST(GroupedGemmHostTest, RejectsUnsupportedShapes) {
  EXPECT_FALSE(grouped_gemm_supported(12, 8));
  EXPECT_FALSE(grouped_gemm_supported(64, kMaxGroupedExperts + 1));
  GroupedGemm g;
  g.in_cols = 64;
  g.out_rows = 64;
  g.in_cols = 12;
  EXPECT_THROW(grouped_gemm(g, MoePairs{}, 4, 2, 8, nullptr), Error);
  // bf16 output rows only from wide groups.
  g.in_cols = 64;
  uint16_t row = 0;
  g.out_bf16 = &row;
  EXPECT_THROW(grouped_gemm(g, MoePairs{}, 4, 2, 8, nullptr), Error);
  g.out_bf16 = nullptr;
  EXPECT_THROW(sort_pairs(nullptr, nullptr, 4, 9, 8, MoePairs{}, nullptr), Error);
  EXPECT_THROW(sort_pairs(nullptr, nullptr, 4, 2, kMaxGroupedExperts + 1, MoePairs{}, nullptr),
               Error);
  EXPECT_FALSE(skinny_gemm_supported(kMaxGroupedTokens + 1, 64));
  EXPECT_FALSE(skinny_gemm_supported(1, 12));
  // Blocks that do not tile the output rows.
  EXPECT_THROW(skinny_gemm_blocks(nullptr, 1, nullptr, 100, 30, 200, 64, nullptr, nullptr), Error);
  EXPECT_THROW(skinny_gemm_blocks(nullptr, 1, nullptr, 0, 30, 60, 64, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace ekva::cuda
