#pragma once
// The KV-policy options shared by the commands that run a model (generate, eval, demo).
#include <CLI/CLI.hpp>
#include <string>

#include "kv/policy.h"

namespace ekva::cli {

struct PolicyArgs {
  std::string policy = "full";
  double kv_budget = 1.0;
  std::string plan;
  int window = 16;
  int sinks = 4;
  int refresh = 64;
};

void add_policy_options(CLI::App* cmd, PolicyArgs& args);
// Loads the plan, if any, and checks it against the model.
PolicyOptions make_policy_options(const PolicyArgs& args, const ModelSpec& spec);

}  // namespace ekva::cli
