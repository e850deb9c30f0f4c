#include "roofline/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "budget/calibration.h"
#include "core/error.h"
#include "io/model_config.h"
#include "support/roofline_workloads.h"

namespace ekva {
namespace {

using testing::decode;
using testing::mixtral;

ModelSpec qwen3() {
  return load_model_config(testing::config_json("qwen3-30b-a3b"));
}

double sum_over(const StepCost& step, OperatorKind kind, double (*field)(const OperatorCost&)) {
  double sum = 0;
  for (const auto& r : step.operators) {
    if (r.kind == kind) sum += field(r);
  }
  return sum;
}

TEST(CostModel, MixtralKvBytesPerTokenInBf16) {
  const ModelSpec s = mixtral();
  // 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes.
  EXPECT_EQ(s.kv_bytes_per_token(2), 131072);
  EXPECT_DOUBLE_EQ(KvRetention::full(s, 1).bytes(s, NumberFormat::kBF16), 131072);
  // One decode step appends exactly one token per sequence.
  const StepCost step = predict_step(s, find_hardware("h200"), decode(1, 100));
  EXPECT_DOUBLE_EQ(step.kv_write_bytes, 131072);
  EXPECT_DOUBLE_EQ(KvRetention::full(s, 1).bytes(s, NumberFormat::kFP8), 65536);
  EXPECT_DOUBLE_EQ(KvRetention::full(s, 1).bytes(s, NumberFormat::kINT4), 32768);
}

TEST(CostModel, MixtralParametersByHand) {
  const auto p = mixtral().parameters();
  const int64_t attn = 4096LL * 4096 * 2 + 2LL * 4096 * 1024;  // q, o; k, v
  const int64_t expert = 3LL * 4096 * 14336;
  const int64_t layer_common = attn + 2 * 4096 + 4096LL * 8;  // + 2 norms + router
  const int64_t embed = 32000LL * 4096;
  EXPECT_EQ(p.total, 32 * (layer_common + 8 * expert) + 2 * embed + 4096);
  EXPECT_EQ(p.active_per_token, 32 * (layer_common + 2 * expert) + 2 * embed + 4096);
  EXPECT_EQ(p.total, 46702792704);             // 46.7B, as published
  EXPECT_EQ(p.active_per_token, 12879925248);  // 12.9B, as published
}

TEST(CostModel, Qwen3HeadDimIsTakenFromTheConfig) {
  const ModelSpec s = qwen3();
  ASSERT_EQ(s.head_dim, 128);  // hidden / heads would be 64
  // 2 x 48 layers x 4 KV heads x 128 x 2 bytes.
  EXPECT_EQ(s.kv_bytes_per_token(2), 98304);
  const auto p = s.parameters();
  const int64_t attn = 2048LL * 4096 * 2 + 2LL * 2048 * 512 + 2 * 128;  // + per-head q/k norms
  const int64_t layer_common = attn + 2 * 2048 + 2048LL * 128;
  const int64_t expert = 3LL * 2048 * 768;
  const int64_t embed = 151936LL * 2048;
  EXPECT_EQ(p.total, 48 * (layer_common + 128 * expert) + 2 * embed + 2048);
  EXPECT_EQ(p.active_per_token, 48 * (layer_common + 8 * expert) + 2 * embed + 2048);

  // Decode attention at batch 1 reads every retained key and value of 4 KV heads of 128.
  const int64_t context = 1000;
  const StepCost step = predict_step(s, find_hardware("h200"), decode(1, context));
  const double per_side = 48.0 * 4 * (context + 1) * 128 * 2;
  EXPECT_DOUBLE_EQ(step.kv_read_bytes, 2 * per_side);
  // Scores: every query head (8 per KV head) against every key: 2·head_dim FLOPs per pair.
  const double pairs = 48.0 * 32 * (context + 1);
  EXPECT_DOUBLE_EQ(
      sum_over(step, OperatorKind::kAttentionValues, [](const OperatorCost& r) { return r.flops; }),
      pairs * 2 * 128);
  const double qkv_flops = 2.0 * 2048 * (4096 + 2 * 512) * 48;
  EXPECT_DOUBLE_EQ(
      sum_over(step, OperatorKind::kQkvProj, [](const OperatorCost& r) { return r.flops; }),
      qkv_flops);
}

TEST(CostModel, DecodeWeightBytesAtBatchOneAreTheActiveParameters) {
  // One token touches exactly top_k experts per layer and one embedding row, so the weights a
  // batch-1 step reads are the active parameters less the embedding table plus one row.
  // The tiny Qwen2-MoE adds q/k/v biases and a gated shared expert.
  const ModelSpec qwen2 =
      load_model_config(std::string(EKVA_FIXTURES) + "/hf-tiny/tiny-qwen2_moe/config.json");
  for (const ModelSpec& s : {mixtral(), qwen3(), qwen2}) {
    const StepCost step = predict_step(s, find_hardware("h200"), decode(1, 64));
    const double active = static_cast<double>(s.parameters().active_per_token);
    const double embed = static_cast<double>(s.vocab_size) * s.hidden_size;
    EXPECT_NEAR(step.weight_bytes, 2 * (active - embed + s.hidden_size), 1.0) << s.model_type;
    EXPECT_NEAR(step.mean_experts_touched(), s.top_k, 1e-9);
  }
}

TEST(CostModel, DistinctExpertsTouchedByABatch) {
  // 8 experts, top-2, 16 tokens: 8 (1 - (6/8)^16) = 8 (1 - 0.0100226...) = 7.9198.
  EXPECT_NEAR(expected_distinct_experts(8, 2, 16), 7.91982, 1e-5);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 1), 2.0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 0), 0.0);
  const StepCost step = predict_step(mixtral(), find_hardware("h200"), decode(16, 64));
  EXPECT_NEAR(step.mean_experts_touched(), 7.91982, 1e-5);
  const double expert_bytes = 3.0 * 4096 * 14336 * 2;
  EXPECT_NEAR(sum_over(step, OperatorKind::kRoutedExperts,
                       [](const OperatorCost& r) { return r.weight_bytes; }),
              32 * 7.91982 * expert_bytes, 32 * 1e-5 * expert_bytes);
}

TEST(CostModel, MeasuredRoutingHistogramSetsTheExpertsTouched) {
  const ModelSpec s = mixtral();
  // Every token goes to experts 0 and 1: whatever the batch, two experts are read.
  // Built element by element: GCC 12 with AVX-512 miscompiles the braced constant {50, 50, 0, ...}
  // into eight 50s.
  std::vector<double> two_experts(8, 0.0);
  two_experts[0] = two_experts[1] = 50;
  std::vector<std::vector<double>> skewed(32, two_experts);
  Workload w = decode(64, 64);
  w.routing = RoutingModel::from_counts(s, skewed, "test");
  EXPECT_NEAR(predict_step(s, find_hardware("h200"), w).mean_experts_touched(), 2.0, 1e-12);
  // A balanced histogram reproduces the uniform formula.
  std::vector<std::vector<double>> balanced(32, std::vector<double>(8, 10));
  w.routing = RoutingModel::from_counts(s, balanced, "test");
  EXPECT_NEAR(predict_step(s, find_hardware("h200"), w).mean_experts_touched(),
              expected_distinct_experts(8, 2, 64), 1e-9);
  std::vector<std::vector<double>> short_rows(32, std::vector<double>(7, 10));
  EXPECT_THROW(RoutingModel::from_counts(s, short_rows, "test"), Error);
}

TEST(CostModel, RoutingIsReadFromCalibrationStatisticsOrCounts) {
  const ModelSpec s = mixtral();
  const auto dir = std::filesystem::temp_directory_path() / "ekva_roofline_routing_test";
  std::filesystem::create_directories(dir);
  CalibrationStats stats;
  stats.model_type = s.model_type;
  stats.num_layers = s.num_layers;
  stats.num_kv_heads = s.num_kv_heads;
  stats.num_experts = s.num_experts;
  stats.moe.assign(s.num_layers, 1);
  const size_t le = static_cast<size_t>(s.num_layers) * s.num_experts;
  const size_t lhe = le * s.num_kv_heads;
  for (auto* v :
       {&stats.routing_primary, &stats.routing_topk, &stats.gate_mass, &stats.output_norm})
    v->assign(le, 0.0);
  stats.coroute.assign(le * s.num_experts, 0.0);
  for (auto* v : {&stats.entropy_sum, &stats.entropy_count, &stats.key_share_sum})
    v->assign(lhe, 0);
  stats.queries.assign(static_cast<size_t>(s.num_layers) * s.num_kv_heads, 0.0);
  // Layer 0 sends every token to experts 3 and 5; the others route evenly.
  for (int l = 0; l < s.num_layers; ++l) {
    for (int e = 0; e < s.num_experts; ++e) {
      stats.routing_topk[stats.le(l, e)] = l == 0 ? (e == 3 || e == 5 ? 100 : 0) : 25;
    }
  }
  stats.save(dir / "stats.json");
  const RoutingModel from_stats = RoutingModel::load(dir / "stats.json", s);
  EXPECT_NEAR(from_stats.experts_touched(s, 0, 32), 2.0, 1e-12);
  EXPECT_NEAR(from_stats.experts_touched(s, 1, 32), expected_distinct_experts(8, 2, 32), 1e-9);

  std::ofstream(dir / "counts.json") << R"({"expert_counts": [[1, 1, 0, 0, 0, 0, 0, 0]]})";
  EXPECT_THROW(RoutingModel::load(dir / "counts.json", s), Error);  // one row for 32 layers
  std::ofstream(dir / "other.json") << R"({"histogram": []})";
  EXPECT_THROW(RoutingModel::load(dir / "other.json", s), Error);
  std::filesystem::remove_all(dir);
}

TEST(CostModel, DecodeAttentionIsMemoryBoundAtTheGqaGroupIntensity) {
  const ModelSpec s = mixtral();
  const HardwareSpec h200 = find_hardware("h200");
  const int64_t context = 4096;
  const StepCost step = predict_step(s, h200, decode(8, context));
  for (const auto& r : step.operators) {
    if (r.kind != OperatorKind::kAttentionScores && r.kind != OperatorKind::kAttentionValues)
      continue;
    EXPECT_EQ(r.bound, Bound::kMemory);
  }
  // By hand, per layer and sequence: 8 KV heads x 4097 keys, each shared by a group of 4 query
  // heads. Scores: 2·128 + 5 (softmax) FLOPs per (query head, key); values: 2·128. Bytes: K and V
  // of 128 bf16 each per key, q read and output written once (32 heads x 128 x 2 bytes each).
  const double keys = 8.0 * (context + 1);
  const double flops = keys * 4 * ((2 * 128 + 5) + 2 * 128);
  const double bytes = keys * 2 * 128 * 2 + 2 * 32 * 128 * 2;
  double f = 0, b = 0, t = 0;
  for (const auto& r : step.operators) {
    if (r.layer == 0 &&
        (r.kind == OperatorKind::kAttentionScores || r.kind == OperatorKind::kAttentionValues)) {
      f += r.flops;
      b += r.bytes();
      t += r.time_s;
    }
  }
  EXPECT_DOUBLE_EQ(f, 8 * flops);
  EXPECT_DOUBLE_EQ(b, 8 * bytes);
  EXPECT_NEAR(f / b, 4.04, 0.01);  // the GQA group size, far below the H200 ridge (~168)
  // Memory-bound time: all of it read at the measured 4.5 TB/s but the output, written at the
  // write rate derived from the 4.16 TB/s copy, plus the fused kernel's measured cost per call.
  const Ceilings c = h200.ceilings(false);
  EXPECT_NEAR(t,
              8 * ((bytes - 32 * 128 * 2) / c.read_bandwidth + 32 * 128 * 2 / c.write_bandwidth) +
                  h200.latency(OperatorKind::kAttentionScores, false) +
                  h200.latency(OperatorKind::kAttentionValues, false),
              1e-12);

  // Prefill over a 4096-token prompt is compute-bound.
  Workload prefill = decode(1, context);
  prefill.phase = Phase::kPrefill;
  const StepCost p = predict_step(s, h200, prefill);
  for (const auto& r : p.operators) {
    if (r.kind == OperatorKind::kAttentionScores || r.kind == OperatorKind::kQkvProj) {
      EXPECT_EQ(r.bound, Bound::kCompute);
    }
  }
  EXPECT_EQ(p.bound, Bound::kCompute);
}

TEST(CostModel, TableTotalsEqualTheSumOfRows) {
  const ModelSpec s = qwen3();
  Workload w = decode(32, 2048);
  w.kv_format = NumberFormat::kFP8;
  const StepCost step = predict_step(s, find_hardware("h100-sxm"), w);
  double flops = 0, bytes = 0, time = 0, kv = 0, weights = 0;
  for (const auto& r : step.operators) {
    flops += r.flops;
    bytes += r.bytes();
    time += r.time_s;
    kv += r.kv_read_bytes + r.kv_write_bytes;
    weights += r.weight_bytes;
    EXPECT_DOUBLE_EQ(r.time_s, std::max(r.compute_time_s, r.memory_time_s));
  }
  EXPECT_NEAR(step.flops, flops, 1e-9 * flops);
  EXPECT_NEAR(step.bytes, bytes, 1e-9 * bytes);
  EXPECT_NEAR(step.time_s, time, 1e-9 * time);
  EXPECT_NEAR(step.kv_read_bytes + step.kv_write_bytes, kv, 1e-9 * kv);
  EXPECT_NEAR(step.weight_bytes, weights, 1e-9 * weights);
  EXPECT_NEAR(step.weight_time_s + step.kv_time_s + step.activation_time_s + step.compute_time_s +
                  step.latency_time_s,
              step.time_s, 1e-9 * step.time_s);
  // The per-operator view sums to the same totals.
  const auto by_op = aggregate_by_operator(step.operators);
  const StepCost again = sum_rows(by_op);
  EXPECT_NEAR(again.flops, step.flops, 1e-9 * flops);
  EXPECT_NEAR(again.bytes, step.bytes, 1e-9 * bytes);
  EXPECT_NEAR(again.time_s, step.time_s, 1e-9 * time);
  int rows = 0;
  for (const auto& r : by_op) rows += r.count;
  EXPECT_EQ(rows, static_cast<int>(step.operators.size()));
  // Every decoder layer of Qwen3-MoE has each of its 10 operators once, plus 3 outside.
  EXPECT_EQ(step.operators.size(), 48u * 10 + 3);
}

TEST(CostModel, MeasuredEfficiencyAndLatencyApplyPerCall) {
  const ModelSpec s = mixtral();
  HardwareSpec hw = find_hardware("h100-sxm");
  const StepCost plain = predict_step(s, hw, decode(16, 1024));
  hw.measured = MeasuredProfile{};
  hw.measured->method = "test";
  hw.measured->operator_efficiency = {{"gemm", 0.5}};
  hw.measured->operator_latency = {{"gemm", 6e-6}, {"attention", 7e-6}};
  const StepCost tuned = predict_step(s, hw, decode(16, 1024));
  ASSERT_EQ(plain.operators.size(), tuned.operators.size());
  for (size_t i = 0; i < plain.operators.size(); ++i) {
    const OperatorCost& a = plain.operators[i];
    const OperatorCost& b = tuned.operators[i];
    switch (operator_class(a.kind)) {
      case OperatorClass::kGemm:
        EXPECT_NEAR(b.time_s, a.time_s / 0.5 + 6e-6, 1e-15);
        break;
      case OperatorClass::kAttention:
        EXPECT_NEAR(b.time_s, a.time_s + 7e-6, 1e-15);
        break;
      case OperatorClass::kElementwise:
        EXPECT_DOUBLE_EQ(b.time_s, a.time_s);
        break;
    }
    // A router reads 64 KiB: its 6 us call cost outweighs its roofline time.
    if (a.kind == OperatorKind::kRouter) {
      EXPECT_EQ(b.bound, Bound::kLatency);
    }
  }
  EXPECT_NEAR(tuned.latency_time_s, 32 * (4 * 6e-6 + 2 * 7e-6) + 6e-6, 1e-12);
}

TEST(CostModel, KvReadFollowsRetentionAndFormat) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  Workload w = decode(4, 8000);
  const double full = predict_step(s, hw, w).kv_read_bytes;
  w.retained = KvRetention::fraction(s, 8000, 0.25);
  EXPECT_DOUBLE_EQ(predict_step(s, hw, w).kv_read_bytes, full * 2001.0 / 8001.0);
  w.kv_format = NumberFormat::kINT4;
  EXPECT_DOUBLE_EQ(predict_step(s, hw, w).kv_read_bytes, full * 2001.0 / 8001.0 / 4);

  // Per (layer, KV head) budgets: one head keeping nothing reads only the new token there.
  w = decode(1, 100);
  w.retained = KvRetention::full(s, 100);
  w.retained.tokens[0] = 0;
  const double one_head = 101.0 * 128 * 2 * 2;
  EXPECT_DOUBLE_EQ(predict_step(s, hw, w).kv_read_bytes,
                   predict_step(s, hw, decode(1, 100)).kv_read_bytes - one_head + 128 * 2 * 2);
}

TEST(CostModel, BudgetPlanSetsTheRetainedTokens) {
  const ModelSpec s = mixtral();
  BudgetPlan plan = BudgetPlan::uniform(s, 8, BudgetPlan::Unit::kFraction, 0.25);
  plan.sink_tokens = 4;
  plan.recent_tokens = 28;
  const KvRetention r = KvRetention::from_plan(s, plan, 1000);
  ASSERT_EQ(r.tokens.size(), 32u * 8);
  for (double t : r.tokens) EXPECT_NEAR(t, 250 + 32, 1e-9);
  // Never more than the context.
  EXPECT_DOUBLE_EQ(KvRetention::from_plan(s, plan, 20).tokens[0], 20);
  // A plan made for another model shape is refused.
  EXPECT_THROW(KvRetention::from_plan(qwen3(), plan, 1000), Error);
}

TEST(CostModel, InvalidWorkloadsAreRejected) {
  const ModelSpec s = mixtral();
  const HardwareSpec hw = find_hardware("h200");
  EXPECT_THROW(predict_step(s, hw, decode(0, 10)), Error);
  Workload w = decode(1, 10);
  w.retained.tokens.assign(3, 1);
  EXPECT_THROW(predict_step(s, hw, w), Error);
  w.retained = KvRetention::full(s, 10);
  w.retained.tokens[5] = 11;  // more than the context
  EXPECT_THROW(predict_step(s, hw, w), Error);
  Workload p = decode(1, 0);
  p.phase = Phase::kPrefill;
  EXPECT_THROW(predict_step(s, hw, p), Error);
  EXPECT_THROW(parse_number_format("fp6", "--kv-dtype"), Error);
}

// A prompt's routed experts take the prefill efficiencies of the kernels the engine runs them as:
// grouped products where the experts average few pairs (Qwen3's 128 experts), one GEMM per expert
// where they average many (Mixtral's 8); a decode step's are grouped products either way.
TEST(CostModel, PromptExpertsTakeTheEfficiencyOfTheirKernels) {
  HardwareSpec hw = find_hardware("h200");
  ASSERT_TRUE(hw.measured.has_value());
  hw.measured->operator_efficiency = {{"routed_experts", 0.5}, {"gemm", 0.9}};
  hw.measured->prefill_efficiency = {{"routed_experts", 0.25}, {"gemm", 0.8}};
  hw.measured->prefill_efficiency["elementwise"] = 0.5;
  const auto experts_row = [&](const ModelSpec& s, Phase phase, int64_t batch) {
    Workload w = decode(batch, 4096);
    w.phase = phase;
    for (const OperatorCost& r : predict_step(s, hw, w).operators) {
      if (r.kind == OperatorKind::kRoutedExperts) return r;
    }
    return OperatorCost{};
  };
  const auto experts_efficiency = [&](const ModelSpec& s, Phase phase, int64_t batch) {
    return experts_row(s, phase, batch).efficiency;
  };
  // Grouped products are one roofline; GEMMs per expert are followed by their activation passes.
  const OperatorCost grouped = experts_row(qwen3(), Phase::kPrefill, 1);
  EXPECT_DOUBLE_EQ(grouped.time_s,
                   std::max(grouped.compute_time_s, grouped.memory_time_s) + grouped.latency_s);
  const OperatorCost gemms = experts_row(mixtral(), Phase::kPrefill, 1);
  const double ceiling = gemms.compute_time_s + gemms.latency_s;
  EXPECT_GT(gemms.time_s, ceiling);
  EXPECT_LT(gemms.time_s, ceiling + gemms.memory_time_s);
  EXPECT_DOUBLE_EQ(experts_efficiency(qwen3(), Phase::kPrefill, 1), 0.25);
  EXPECT_DOUBLE_EQ(experts_efficiency(mixtral(), Phase::kPrefill, 1), 0.8);
  EXPECT_DOUBLE_EQ(experts_efficiency(mixtral(), Phase::kDecode, 64), 0.5);
  // Past 512 pairs per expert a decode step's experts are GEMMs too (Mixtral, 2049 sequences).
  EXPECT_DOUBLE_EQ(experts_efficiency(mixtral(), Phase::kDecode, 2049), 0.9);
}

}  // namespace
}  // namespace ekva
