#pragma once
// RoPE frequencies of every scaling type, as Hugging Face's rope_init functions compute them. Every
// backend rotates with these numbers, so the table is defined once, below the backends.
#include <vector>

#include "arch/model_spec.h"

namespace ekva {

struct RopeTable {
  std::vector<double> inv_freq;   // head_dim / 2 entries
  double attention_factor = 1.0;  // scales cos and sin (yarn)
};

RopeTable make_rope_table(const RopeSpec& rope, int head_dim);

}  // namespace ekva
