#pragma once
// --device: which backend runs a command's engines (generate, forward, eval, calibrate, demo,
// serve).
#include <CLI/CLI.hpp>
#include <string>

#include "engine/engine.h"

namespace ekva::cli {

struct DeviceArgs {
  std::string device = "auto";  // cpu, cuda, or auto: the GPU when one is present
};

void add_device_option(CLI::App* cmd, DeviceArgs& args);

// Sets the engine's backend from --device. On the GPU, K/V are stored in bf16 unless kv_dtype
// (--kv-dtype, empty when not given) asks otherwise, which the CUDA backend refuses. Returns the
// device that runs: "cpu" or "cuda". --device cuda without a GPU or a CUDA build is an error.
std::string use_device(const DeviceArgs& args, const std::string& kv_dtype, EngineOptions& options);

}  // namespace ekva::cli
