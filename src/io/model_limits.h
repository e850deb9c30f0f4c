#pragma once
// Bounds on a model's shape, far above any released checkpoint, so that a corrupt or hostile file
// (config.json, a BudgetPlan, calibration statistics) is refused before anything is sized from
// it: the engine, the plans and the roofline allocate per layer, head, expert and token id.
#include <cstdint>

namespace ekva::model_limits {

inline constexpr int64_t kLayers = 1024;
inline constexpr int64_t kHeads = 1024;
inline constexpr int64_t kHeadDim = 4096;
inline constexpr int64_t kHidden = int64_t{1} << 17;
inline constexpr int64_t kIntermediate = int64_t{1} << 20;
inline constexpr int64_t kExperts = 4096;
inline constexpr int64_t kVocab = int64_t{1} << 24;

}  // namespace ekva::model_limits
