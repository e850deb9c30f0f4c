#pragma once
// What a KV budget buys a server whose KV memory is fixed (`ekva serve --kv-memory`): how many
// sequences its admission rule lets run at once, and the decode step of that batch. The rule is the
// server's (serve::Scheduler): a request is admitted with a full cache of its prompt and output
// reserved, which shrinks to what its budget keeps once its prompt is compressed, and every
// (layer, KV head) holds whole pages. So, once the memory is full, one request is being prefilled
// at its full size beside the others at their kept size.
#include <cstdint>
#include <string>

#include "roofline/cost_model.h"

namespace ekva {

struct ServingConfig {
  double kv_memory_bytes = 0;  // K and V pages the server may use
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 1;     // tokens generated per request
  double budget = 1.0;        // share of the prompt each (layer, KV head) keeps; >= 1: full KV
  int page_size = 16;         // tokens per KV page
  int64_t max_sequences = 0;  // the server's --max-sequences; 0: no limit
  // Formats and routing; phase, batch, context and retention are set from the rest.
  Workload base;
};

struct ServingPrediction {
  double page_bytes = 0;
  int64_t capacity_pages = 0;
  int64_t admit_pages = 0;  // a request's reservation until its prompt is compressed
  int64_t kept_pages = 0;   // its reservation afterwards
  int64_t sequences = 0;    // decoded together once the memory is full; 0: not even one fits
  std::string limited_by;   // "memory" or "max sequences"
  double context = 0;       // mean tokens in a sequence's context over its decode
  double kept_tokens = 0;   // mean tokens each (layer, KV head) attention reads over the decode
  StepCost step;            // one decode step of `sequences` (empty when none fits)
  double tokens_per_s = 0;  // sequences / step time
};

// Throws kInvalidArgument for a configuration without memory, prompt, output or page size, or a
// budget that is not positive.
ServingPrediction predict_serving(const ModelSpec& spec, const HardwareSpec& hw,
                                  const ServingConfig& config, bool datasheet_only = false);
// One decode step of `batch` sequences of the configuration (a measured batch may differ from the
// predicted one). The same checks; batch >= 1.
StepCost serving_step(const ModelSpec& spec, const HardwareSpec& hw, const ServingConfig& config,
                      int64_t batch, bool datasheet_only = false);

}  // namespace ekva
