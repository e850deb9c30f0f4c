#pragma once
// How a row of logits becomes a token: the one definition every backend follows, so that a draw
// made where the logits are picks what the host would.
#include <cstdint>

namespace ekva {

// Greedy at temperature 0 (the lowest id among the largest logits). Otherwise the candidates best
// first (higher logit, then lower id), cut to top_k and then to the shortest prefix whose
// probability reaches top_p, weighted exp((logit - max) / temperature) in double precision; the
// token is the first candidate whose running weight exceeds u times their total. A draw with
// neither cut walks the candidates in id order instead: the same distribution, with nothing to
// sort.
struct TokenDraw {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off; in (0, 1]
  double u = 0.0;            // uniform in [0, 1)
};

// Throws kInvalidArgument naming the field of a draw outside its range (a finite temperature >= 0,
// top-k >= 0, top-p in (0, 1], u in [0, 1)).
void check_draw(const TokenDraw& draw);

// The token of one row of logits under `draw`, or -1 - e when entry e is the row's first that is
// not finite.
int32_t draw_token(const float* logits, int vocab, const TokenDraw& draw);

}  // namespace ekva
