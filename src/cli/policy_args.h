#pragma once
// The KV-policy options shared by the commands that run a model (generate, eval, demo).
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "kv/policy.h"

namespace ekva::cli {

struct PolicyArgs {
  std::string policy = "full";
  std::optional<double> budget;  // kv_budget.h; none: the plan's own, or everything
  std::string plan;
  int window = 16;
  int sinks = 4;
  int refresh = 64;
  std::string kv_dtype;      // element type the engine stores K and V in; empty: the device's own
  ReserveOverrides reserve;  // unset: the plan's, or the default
};

// --policy and --budget (its old spelling --kv-budget accepted with a deprecation note), then the
// shared options.
void add_policy_options(CLI::App* cmd, PolicyArgs& args);
// --plan, --window and --sinks: what every command that runs policies takes (eval names its
// policies and budgets in lists).
void add_shared_policy_options(CLI::App* cmd, PolicyArgs& args);
// The engine's KV page format from --kv-dtype (f32 or bf16; f32 when not given).
KvFormat kv_format(const PolicyArgs& args);
// Loads the plan, if any, and checks it against the model.
PolicyOptions make_policy_options(const PolicyArgs& args, const ModelSpec& spec);

}  // namespace ekva::cli
