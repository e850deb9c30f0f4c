#pragma once
// The model and workloads the Roofline tests price.
#include <cstdint>

#include "io/model_config.h"
#include "roofline/cost_model.h"
#include "support/repo_paths.h"

namespace ekva::testing {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

inline ModelSpec mixtral() {
  return load_model_config(config_json("mixtral-8x7b"));
}

// A decode step of `batch` sequences over `context` tokens each.
inline Workload decode(int64_t batch, int64_t context) {
  Workload w;
  w.batch = batch;
  w.context = context;
  return w;
}

}  // namespace ekva::testing
