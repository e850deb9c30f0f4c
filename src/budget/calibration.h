#pragma once
// Calibration: run the engine over text and measure, per (layer, KV head, expert), how the model
// uses its context: routing, gate mass, expert output norms, optionally each expert's loss
// contribution, the attention entropy of the queries routed to each expert, and retention curves
// (the attention mass an expert's best keys carry, for a grid of budgets). Plans are made from
// these statistics.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"

namespace ekva {

struct CalibrationOptions {
  int chunk_tokens = 512;  // each chunk is one prefill from position 0
  int query_stride = 4;    // every n-th query feeds the attention statistics
  int min_keys = 32;       // queries that see fewer keys are skipped
  bool ablation =
      false;  // measure each expert's loss contribution (one extra pass per layer and expert)
  EngineOptions engine;  // where the passes run (the backend) and how K/V are stored
};

struct CalibrationStats {
  static constexpr int kVersion = 1;
  std::string model_type;
  int num_layers = 0, num_kv_heads = 0, num_experts = 0;
  std::vector<double> grid;  // retention budgets as fractions of the keys a query sees
  int64_t tokens = 0;
  int chunks = 0;
  int chunk_tokens = 0;
  double base_loss = 0.0;         // mean next-token cross-entropy over the calibration text
  double stats_seconds = 0.0;     // the statistics pass
  double ablation_seconds = 0.0;  // the loss-contribution passes (0 unless requested)
  std::vector<uint8_t> moe;       // [layer]: the layer routes
  // [layer][expert]
  std::vector<double> routing_primary, routing_topk, gate_mass, output_norm, loss_contribution;
  std::vector<double> coroute;  // [layer][expert][expert]: tokens routed to both (top-k pairs)
  // [layer][kv head][expert]
  std::vector<double> entropy_sum, entropy_count, key_share_sum;
  std::vector<double> retention_sum;  // [layer][kv head][expert][grid]
  std::vector<double> queries;        // [layer][kv head]: observation queries

  size_t le(int l, int e) const { return static_cast<size_t>(l) * num_experts + e; }
  size_t lhe(int l, int h, int e) const {
    return (static_cast<size_t>(l) * num_kv_heads + h) * num_experts + e;
  }
  // Mean attention mass expert e's best keys capture at grid point g (over observation queries).
  double retention(int l, int h, int e, size_t g) const;
  double mean_entropy(int l, int h, int e) const;
  double key_share(int l, int h, int e) const;

  nlohmann::json to_json() const;
  static CalibrationStats from_json(const nlohmann::json& j, const std::string& source);
  static CalibrationStats load(const std::filesystem::path& path);
  void save(const std::filesystem::path& path) const;
  void check_model(const ModelSpec& spec) const;  // throws when made for another model shape
};

// Consecutive chunks of chunk_tokens cut from ids, at most max_tokens in all; a shorter tail is
// dropped. Throws kInvalidArgument when not even one chunk fits.
std::vector<std::vector<int32_t>> calibration_chunks(const std::vector<int32_t>& ids,
                                                     int chunk_tokens, int64_t max_tokens);

// Progress: (chunks done, chunks in all, pass name).
using CalibrationProgress = std::function<void(int, int, const std::string&)>;

// Runs the statistics pass (and the ablation when asked) over token chunks.
CalibrationStats calibrate(const Model& model, const std::vector<std::vector<int32_t>>& chunks,
                           const CalibrationOptions& options,
                           const CalibrationProgress& progress = {});

}  // namespace ekva
