#pragma once
// The operators of one forward step that the roofline model costs, and the class of kernel each
// runs as (which decides the peak it is held to and the efficiency factor that applies).
#include <optional>
#include <string_view>
#include <vector>

namespace ekva {

enum class OperatorKind {
  kEmbedding,
  kAttnNorm,
  kQkvProj,
  kQkNorm,
  kRopeKvWrite,  // RoPE on q and k fused with appending k and v to the cache
  kAttentionScores,
  kAttentionValues,
  kOutProj,
  kMlpNorm,
  kRouter,
  kRoutedExperts,
  kSharedExpert,
  kDenseMlp,
  kFinalNorm,
  kLmHead,
};

enum class OperatorClass { kGemm, kAttention, kElementwise };

// A step that decodes one token per sequence, or one that fills the cache from a prompt.
enum class Phase { kDecode, kPrefill };
std::string_view phase_name(Phase phase);
Phase parse_phase(std::string_view name, std::string_view what);

std::string_view operator_name(OperatorKind kind);
OperatorClass operator_class(OperatorKind kind);
std::string_view operator_class_name(OperatorClass cls);
const std::vector<OperatorKind>& all_operators();
std::optional<OperatorKind> find_operator(std::string_view name);
std::optional<OperatorClass> find_operator_class(std::string_view name);

}  // namespace ekva
