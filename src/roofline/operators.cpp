#include "roofline/operators.h"

#include "core/error.h"

namespace ekva {

std::string_view operator_name(OperatorKind kind) {
  switch (kind) {
    case OperatorKind::kEmbedding:
      return "embedding";
    case OperatorKind::kAttnNorm:
      return "attn_norm";
    case OperatorKind::kQkvProj:
      return "qkv_proj";
    case OperatorKind::kQkNorm:
      return "qk_norm";
    case OperatorKind::kRopeKvWrite:
      return "rope_kv_write";
    case OperatorKind::kAttentionScores:
      return "attention_scores";
    case OperatorKind::kAttentionValues:
      return "attention_values";
    case OperatorKind::kOutProj:
      return "out_proj";
    case OperatorKind::kMlpNorm:
      return "mlp_norm";
    case OperatorKind::kRouter:
      return "router";
    case OperatorKind::kRoutedExperts:
      return "routed_experts";
    case OperatorKind::kSharedExpert:
      return "shared_expert";
    case OperatorKind::kDenseMlp:
      return "dense_mlp";
    case OperatorKind::kFinalNorm:
      return "final_norm";
    case OperatorKind::kLmHead:
      return "lm_head";
  }
  return "?";
}

OperatorClass operator_class(OperatorKind kind) {
  switch (kind) {
    case OperatorKind::kQkvProj:
    case OperatorKind::kOutProj:
    case OperatorKind::kRouter:
    case OperatorKind::kRoutedExperts:
    case OperatorKind::kSharedExpert:
    case OperatorKind::kDenseMlp:
    case OperatorKind::kLmHead:
      return OperatorClass::kGemm;
    case OperatorKind::kAttentionScores:
    case OperatorKind::kAttentionValues:
      return OperatorClass::kAttention;
    case OperatorKind::kEmbedding:
    case OperatorKind::kAttnNorm:
    case OperatorKind::kQkNorm:
    case OperatorKind::kRopeKvWrite:
    case OperatorKind::kMlpNorm:
    case OperatorKind::kFinalNorm:
      return OperatorClass::kElementwise;
  }
  return OperatorClass::kElementwise;
}

std::string_view operator_class_name(OperatorClass cls) {
  switch (cls) {
    case OperatorClass::kGemm:
      return "gemm";
    case OperatorClass::kAttention:
      return "attention";
    case OperatorClass::kElementwise:
      return "elementwise";
  }
  return "?";
}

const std::vector<OperatorKind>& all_operators() {
  static const std::vector<OperatorKind> kinds = {
      OperatorKind::kEmbedding,       OperatorKind::kAttnNorm,      OperatorKind::kQkvProj,
      OperatorKind::kQkNorm,          OperatorKind::kRopeKvWrite,   OperatorKind::kAttentionScores,
      OperatorKind::kAttentionValues, OperatorKind::kOutProj,       OperatorKind::kMlpNorm,
      OperatorKind::kRouter,          OperatorKind::kRoutedExperts, OperatorKind::kSharedExpert,
      OperatorKind::kDenseMlp,        OperatorKind::kFinalNorm,     OperatorKind::kLmHead,
  };
  return kinds;
}

std::optional<OperatorKind> find_operator(std::string_view name) {
  for (OperatorKind k : all_operators()) {
    if (operator_name(k) == name) return k;
  }
  return std::nullopt;
}

std::optional<OperatorClass> find_operator_class(std::string_view name) {
  for (OperatorClass c :
       {OperatorClass::kGemm, OperatorClass::kAttention, OperatorClass::kElementwise}) {
    if (operator_class_name(c) == name) return c;
  }
  return std::nullopt;
}

std::string_view phase_name(Phase phase) {
  return phase == Phase::kDecode ? "decode" : "prefill";
}

Phase parse_phase(std::string_view name, std::string_view what) {
  if (name == "decode") return Phase::kDecode;
  if (name == "prefill") return Phase::kPrefill;
  fail(ErrorKind::kInvalidArgument, "{}: '{}' is not a phase (decode, prefill)", what, name);
}

}  // namespace ekva
