#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include "core/error.h"

namespace ekva {

bool routed_experts_grouped(int64_t tokens, int top_k, int num_experts) {
  return tokens <= kMaxGroupedStepTokens || tokens * top_k <= kMaxMeanGroupedPairs * num_experts;
}

StepPlan plan_step(const ModelSpec& spec, const ForwardBatch& batch, KvLayout& layout) {
  const int n = batch.size();
  if (batch.seq.size() != batch.tokens.size() || batch.pos.size() != batch.tokens.size() ||
      (!batch.score_query.empty() && batch.score_query.size() != batch.tokens.size())) {
    fail(ErrorKind::kInvalidArgument,
         "forward batch: tokens, seq, pos and score_query differ in length");
  }
  for (int i = 0; i < n; ++i) {
    if (batch.tokens[i] < 0 || batch.tokens[i] >= spec.vocab_size) {
      fail(ErrorKind::kInvalidArgument, "token id {} at index {} is outside the vocabulary [0, {})",
           batch.tokens[i], i, spec.vocab_size);
    }
    if (batch.seq[i] < 0 || batch.seq[i] >= layout.num_sequences()) {
      fail(ErrorKind::kInvalidArgument,
           "sequence {} at index {} is outside the cache's {} sequences", batch.seq[i], i,
           layout.num_sequences());
    }
    if (batch.pos[i] < 0 || batch.pos[i] >= spec.max_position) {
      fail(ErrorKind::kInvalidArgument,
           "position {} exceeds the model's context of {} tokens (max_position_embeddings)",
           batch.pos[i], spec.max_position);
    }
  }
  for (int32_t r : batch.logit_rows) {
    if (r < 0 || r >= n) fail(ErrorKind::kInvalidArgument, "logit row {} out of range", r);
  }
  StepPlan p;
  p.batch = batch;
  p.num_layers = spec.num_layers;
  p.num_sequences = layout.num_sequences();
  p.num_kv_heads = spec.num_kv_heads;
  const int H = spec.num_kv_heads;
  layout.append_step(batch.seq, batch.pos, p.slots);
  p.lengths.assign(static_cast<size_t>(spec.num_layers) * p.num_sequences * H, 0);
  // A touched table's length is one past the slot of its sequence's last token in the step, the
  // highest it was given (read from the slots, not from the tables: at serving batch sizes each
  // table is another place in memory).
  std::vector<int32_t> last_token(p.num_sequences, -1);
  for (int t = 0; t < n; ++t) last_token[batch.seq[t]] = t;
  for (int l = 0; l < spec.num_layers; ++l) {
    for (int s = 0; s < p.num_sequences; ++s) {
      const int t = last_token[s];
      if (t < 0) continue;
      for (int h = 0; h < H; ++h) {
        p.lengths[(static_cast<size_t>(l) * p.num_sequences + s) * H + h] =
            p.slots[(static_cast<size_t>(l) * n + t) * H + h] + 1;
      }
    }
  }
  // Each sequence's next position follows the highest position it received in this batch.
  for (int t = 0; t < n; ++t) {
    const int32_t next = batch.pos[t] + 1;
    if (next > layout.next_position(batch.seq[t]))
      layout.advance(batch.seq[t], next - layout.next_position(batch.seq[t]));
  }
  p.expert_rows = n * std::max(spec.top_k, 1);
  p.logit_rows = batch.logit_rows;
  if (p.logit_rows.empty()) {
    p.logit_rows.resize(n);
    std::iota(p.logit_rows.begin(), p.logit_rows.end(), 0);
  }
  return p;
}

std::vector<int32_t> Backend::run_tokens(const StepPlan& plan, KvLayout& layout,
                                         std::span<const TokenDraw> draws) {
  const size_t rows = plan.logit_rows.size();
  if (draws.size() != rows) {
    fail(ErrorKind::kInvalidArgument, "run_tokens: {} logit rows but {} draws", rows, draws.size());
  }
  const std::vector<float> logits = run(plan, layout, nullptr);
  std::vector<int32_t> tokens(rows);
  if (rows == 0) return tokens;
  const size_t vocab = logits.size() / rows;
  // Rows draw in parallel (a server's batch); an exception must not leave the parallel region.
  std::exception_ptr failure;
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r) {
    try {
      tokens[r] = draw_token(logits.data() + r * vocab, static_cast<int>(vocab), draws[r]);
    } catch (...) {
#pragma omp critical(ekva_draw_failure)
      failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return tokens;
}

}  // namespace ekva
