#include "backend/token_draw.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace ekva {

void check_draw(const TokenDraw& draw) {
  if (!std::isfinite(draw.temperature) || draw.temperature < 0.0f) {
    fail(ErrorKind::kInvalidArgument, "temperature must be a finite number >= 0, got {}",
         draw.temperature);
  }
  if (!(draw.top_p > 0.0f && draw.top_p <= 1.0f)) {
    fail(ErrorKind::kInvalidArgument, "top-p must be in (0, 1], got {}", draw.top_p);
  }
  if (draw.top_k < 0) fail(ErrorKind::kInvalidArgument, "top-k must be >= 0, got {}", draw.top_k);
  if (!(draw.u >= 0.0 && draw.u < 1.0)) {
    fail(ErrorKind::kInvalidArgument, "a draw's u must be in [0, 1), got {}", draw.u);
  }
}

int32_t draw_token(const float* logits, int vocab, const TokenDraw& draw) {
  const float* bad =
      std::find_if(logits, logits + vocab, [](float x) { return !std::isfinite(x); });
  if (bad != logits + vocab) return static_cast<int32_t>(-1 - (bad - logits));
  if (draw.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  }
  const double mx = *std::max_element(logits, logits + vocab);
  const auto id_weight = [&](int i) {
    return std::exp((static_cast<double>(logits[i]) - mx) / draw.temperature);
  };
  if ((draw.top_k <= 0 || draw.top_k >= vocab) && draw.top_p >= 1.0f) {
    double total = 0.0;
    for (int i = 0; i < vocab; ++i) total += id_weight(i);
    const double target = draw.u * total;
    double running = 0.0;
    for (int i = 0; i < vocab; ++i) {
      running += id_weight(i);
      if (running > target) return i;
    }
    return vocab - 1;  // u * total rounded up to the total
  }
  // Only as many candidates as the draw reaches are put in order, a stretch at a time (each twice
  // the last), since a full sort of the vocabulary costs milliseconds per token.
  const auto better = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  size_t keep = draw.top_k > 0 ? std::min<size_t>(draw.top_k, vocab) : vocab;
  if (keep < ids.size()) std::nth_element(ids.begin(), ids.begin() + keep, ids.end(), better);
  size_t ordered = 0, stretch = 64;
  const auto order_next = [&] {
    const size_t end = std::min(keep, ordered + stretch);
    if (end < keep)
      std::nth_element(ids.begin() + ordered, ids.begin() + end, ids.begin() + keep, better);
    std::sort(ids.begin() + ordered, ids.begin() + end, better);
    ordered = end;
    stretch *= 2;
  };
  const auto weight = [&](size_t i) { return id_weight(ids[i]); };
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += weight(i);
  if (draw.top_p < 1.0f) {
    double cum = 0.0;
    size_t cut = 0;
    bool reached = false;
    while (cut < keep && !reached) {
      if (cut == ordered) order_next();
      cum += weight(cut++);
      reached = cum / mass >= draw.top_p;
    }
    keep = cut;
    mass = cum;
  }
  const double target = draw.u * mass;
  double running = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    if (i == ordered) order_next();
    running += weight(i);
    if (running > target) return ids[i];
  }
  return ids[keep - 1];  // u * mass rounded up to the mass
}

}  // namespace ekva
