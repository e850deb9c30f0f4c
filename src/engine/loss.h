#pragma once
#include <cstdint>
#include <vector>

namespace ekva {

// Mean next-token cross-entropy of a sequence's logits [T, vocab]: row t predicts tokens[t + 1].
double next_token_loss(const std::vector<float>& logits, const std::vector<int32_t>& tokens,
                       int vocab);

}  // namespace ekva
