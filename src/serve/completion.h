#pragma once
// The OpenAI completions request as EKVA reads it, and the text of a completion as it grows.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/generate.h"
#include "kv/policy.h"
#include "tokenizer/tokenizer.h"

namespace ekva::serve {

// A request field at fault: an ekva::Error (kInvalidArgument) that also names the field, which the
// server returns as the error's "param".
class FieldError : public Error {
 public:
  FieldError(std::string field, const std::string& message)
      : Error(ErrorKind::kInvalidArgument, message), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

struct CompletionRequest {
  std::vector<int32_t> prompt;  // token ids, the text one encoded with the tokenizer's BOS/EOS
  int max_tokens = 16;
  SamplingOptions sampling;       // OpenAI's defaults: temperature 1, top_p 1; seed 0
  std::vector<std::string> stop;  // at most 4, none empty
  bool stream = false;
  bool ignore_eos = false;  // vLLM's extension: generate max_tokens whatever comes
  std::optional<std::string> kv_policy;
  std::optional<double> kv_budget;
};

// What a request is checked against.
struct CompletionLimits {
  const ModelSpec* spec = nullptr;
  const Tokenizer* tokenizer = nullptr;  // null: text prompts and stop strings are refused
  std::string model_name;                // a request naming another model is refused
};

// Parses a POST /v1/completions body. Malformed JSON is a FieldError on "body"; a field of the
// wrong type or out of range, a prompt longer than the context, or a prompt and max_tokens that
// together exceed it are FieldErrors on that field. The KV policy's own checks (its name, its
// budget) are left to the caller, which knows the server's plan.
CompletionRequest parse_completion_request(std::string_view body, const CompletionLimits& limits);

// The text of a completion's tokens, cut before the first stop string. Text that could still be
// the start of a stop string is held back from the ready part until the completion ends.
class CompletionText {
 public:
  CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop);
  // Adds a generated token; false once a stop string has appeared (the text then ends before it).
  bool add(int32_t token);
  // The text not taken yet that can be sent: all of it once `finished`.
  std::string take_ready(bool finished);

 private:
  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_;
  std::vector<int32_t> known_;  // the ids the tokenizer has text for
  std::string text_;
  size_t taken_ = 0;
  bool stopped_ = false;
};

}  // namespace ekva::serve
