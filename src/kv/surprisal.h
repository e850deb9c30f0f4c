#pragma once
// Routing surprisal: how unusual a prompt token's expert routing is *within its own prompt*. A
// token routed the way few others in the context are (a needle among filler, a header among values)
// is a candidate the observation window may misrank, so a KV policy can reserve room for the most
// surprising tokens before ranking the rest by attention. Nothing here needs calibration data:
// every frequency is counted in the prompt itself.
//
// Definitions (T prompt tokens, k the layer's top-k, summed over the MoE layers given):
//  - top-k < 4, exact sets: a token's routing type at a layer is its set of k experts (order and
//    gates ignored); p(type) = tokens of that type / T; the token's surprisal there is -ln p(type).
//  - top-k >= 4, gate-weighted loads: exact sets of 4 or more out of dozens of experts almost never
//    repeat, so every token would look equally rare. Instead each token's gates are renormalised
//    over its own top-k (g, summing to 1, so every token weighs the same whatever mass its top-k
//    drew), the in-context load of expert e is load_e = sum_t g_{t,e} / T, and the token's
//    surprisal there is sum_e g_{t,e} * (-ln load_e): the cross-entropy of its routing against the
//    prompt's.
//  - token-id rarity (the expert-blind control): one "layer" whose type is the token id.
// Dense layers carry no routing and are simply not passed.
//
// Reserved tokens: with span s > 0, each token's surprisal is first replaced by the mean over the
// tokens within s positions of it (fewer at the prompt's ends): a needle is a run of unusually
// routed tokens, where a rare word in prose is mostly one, so the mean keeps the first and dilutes
// the second. Then those with surprisal > mean + threshold x sd (population sd over the T tokens;
// strict, so a prompt whose tokens all score alike reserves nothing), at most floor(cap x room) of
// them, highest surprisal first and, at equal surprisal, earlier position first.
//
// Plain vectors in and out; results depend only on the inputs (sums run in token order).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ekva {

// One MoE layer's routing of a prompt. Token t's experts are experts[t*top_k .. t*top_k + top_k),
// best first, and gates[...] the router weights of the same experts (renormalised or not); exact
// sets ignore the gates, so below top-k 4 they may be left empty.
struct LayerRouting {
  int top_k = 0;
  std::vector<int32_t> experts;
  std::vector<float> gates;
};

enum class SurprisalDefinition { kExactSet, kGateWeightedLoad };
// kExactSet below top-k 4, kGateWeightedLoad from 4 on.
SurprisalDefinition surprisal_definition(int top_k);

// Per token (tokens of them), the surprisal summed over `layers`, each under its top-k's
// definition; all zero when no layer is given. Throws kInvalidArgument for a layer whose vectors do
// not hold tokens x top_k entries, a negative or repeated expert in a token's top-k, or (loads) a
// negative or non-finite gate or a token whose gates sum to zero.
std::vector<double> routing_surprisal(const std::vector<LayerRouting>& layers, size_t tokens);

// Per token, -ln(occurrences of its id in token_ids / token_ids.size()).
std::vector<double> token_rarity_surprisal(const std::vector<int32_t>& token_ids);

// The defaults were chosen on the dev seed (docs/RESULTS.md, "A span, on the dev seed").
struct ReserveOptions {
  double threshold = 4.0;  // z: outliers lie above mean + z x sd
  double cap = 0.25;       // share of the room the reserve may take, in [0, 1]
  int span = 2;            // >= 0: the surprisal is averaged over this many positions either side
};

// Per token, the mean of `surprisal` over the tokens within `span` positions of it (the input for
// span 0). Throws kInvalidArgument for a negative span.
std::vector<double> span_mean(const std::vector<double>& surprisal, int span);

// Positions whose surprisal exceeds mean + threshold x sd, highest surprisal first, ties by earlier
// position; empty for an empty input or one whose scores are all equal. Throws kInvalidArgument for
// a non-finite threshold or surprisal.
std::vector<int> surprisal_outliers(const std::vector<double>& surprisal, double threshold);

// The reserve's candidates before its cap, in the order it takes them:
// surprisal_outliers(span_mean(surprisal, span), threshold).
std::vector<int> reserve_candidates(const std::vector<double>& surprisal,
                                    const ReserveOptions& options);

// floor(cap x room), where a product less than 1e-9 below an integer counts as that integer
// (0.29 x 100 is 28.999999999999996 in binary floating point but reserves 29). Throws
// kInvalidArgument for a cap outside [0, 1] or a negative room.
size_t reserve_limit(double cap, int room);

// The first reserve_limit(cap, room) of reserve_candidates(surprisal, options): the positions to
// keep first in a head that may hold `room` tokens.
std::vector<int> reserved_tokens(const std::vector<double>& surprisal, int room,
                                 const ReserveOptions& options = {});

}  // namespace ekva
