#include "engine/loss.h"

#include <algorithm>
#include <cmath>

namespace ekva {

double next_token_loss(const std::vector<float>& logits, const std::vector<int32_t>& tokens,
                       int vocab) {
  double total = 0.0;
  const size_t n = tokens.size();
  for (size_t t = 0; t + 1 < n; ++t) {
    const float* row = logits.data() + t * vocab;
    const float mx = *std::max_element(row, row + vocab);
    double sum = 0.0;
    for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
    total += std::log(sum) + mx - row[tokens[t + 1]];
  }
  return n > 1 ? total / static_cast<double>(n - 1) : 0.0;
}

}  // namespace ekva
