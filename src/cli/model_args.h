#pragma once
// --model and --random-weights (bench, serve): a checkpoint directory, or a config.json (or a
// directory holding one) with seeded random weights made on the GPU, for full-size models whose
// checkpoints are too large to ship or to hold on the GPU machine's disk.
#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "engine/generate.h"
#include "model/model.h"

namespace ekva::cli {

struct ModelArgs {
  std::string model;
  std::optional<uint64_t> random_seed;
};

// Adds --model (required, described by model_help) and --random-weights SEED.
void add_model_options(CLI::App* cmd, ModelArgs& args, const std::string& model_help);
// --temperature, --top-k, --top-p and --seed (generate's sampling; Sampler checks the values).
void add_sampling_options(CLI::App* cmd, SamplingOptions& sampling);

// A model whose weights are on the GPU, uploaded or made once for every engine of a command.
struct DeviceWeights {
  std::unique_ptr<Model> model;  // the checkpoint; with random weights its shape alone
  BackendFactory backend;        // CUDA backends over the weights on the device
  size_t bytes = 0;              // the weights' device bytes
  double seconds = 0;            // to upload or make them
  bool random = false;
};

// Puts the weights on the GPU: the checkpoint's, uploaded, or with --random-weights seeded random
// ones made there (the same seed gives the same weights). Fails with kOutOfMemory, naming the
// bytes, unless the weights and reserve_bytes fit in free device memory; kUnsupported without a
// CUDA device or a CUDA build.
DeviceWeights weights_on_device(const ModelArgs& args, size_t reserve_bytes);

// The name a server lists for --model: its directory's, or for a config.json the directory holding
// it.
std::string model_name(const std::string& model);

}  // namespace ekva::cli
