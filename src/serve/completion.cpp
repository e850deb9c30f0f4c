#include "serve/completion.h"

#include <cmath>
#include <limits>

#include "io/json_file.h"

namespace ekva::serve {
namespace {

using nlohmann::json;

const json* find(const json& body, const char* field) {
  const auto it = body.find(field);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

int64_t integer_field(const json& value, const char* field, int64_t lo, int64_t hi) {
  if (!value.is_number_integer()) {
    throw FieldError(field,
                     fmt::format("'{}' must be an integer, got {}", field, json_excerpt(value)));
  }
  if (!json_integer_in(value, lo, hi)) {
    throw FieldError(
        field, fmt::format("'{}' must be in [{}, {}], got {}", field, lo, hi, json_excerpt(value)));
  }
  return value.get<int64_t>();
}

double number_field(const json& value, const char* field) {
  if (!value.is_number() || !std::isfinite(value.get<double>())) {
    throw FieldError(
        field, fmt::format("'{}' must be a finite number, got {}", field, json_excerpt(value)));
  }
  return value.get<double>();
}

bool bool_field(const json& value, const char* field) {
  if (!value.is_boolean()) {
    throw FieldError(field,
                     fmt::format("'{}' must be true or false, got {}", field, json_excerpt(value)));
  }
  return value.get<bool>();
}

std::vector<int32_t> prompt_field(const json& value, const CompletionLimits& limits) {
  const ModelSpec& s = *limits.spec;
  if (value.is_string()) {
    if (limits.tokenizer == nullptr) {
      throw FieldError("prompt",
                       "'prompt': this server has no tokenizer (random weights, or a checkpoint "
                       "without one); send the prompt as an array of token ids");
    }
    try {
      return limits.tokenizer->encode(value.get<std::string>(), true);
    } catch (const Error& e) {
      throw FieldError("prompt", fmt::format("'prompt': {}", e.what()));
    }
  }
  if (!value.is_array() || value.empty() || !value[0].is_number_integer()) {
    throw FieldError("prompt",
                     "'prompt' must be a string or a non-empty array of token ids (one prompt "
                     "per request)");
  }
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const json& id : value) {
    if (!json_integer_in(id, 0, s.vocab_size - 1)) {
      throw FieldError("prompt", fmt::format("'prompt': token {} at index {} is not an id in "
                                             "[0, {})",
                                             json_excerpt(id), ids.size(), s.vocab_size));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

std::vector<std::string> stop_field(const json& value, const CompletionLimits& limits) {
  std::vector<std::string> stop;
  if (value.is_string()) {
    stop.push_back(value.get<std::string>());
  } else if (value.is_array() && value.size() <= 4) {
    for (const json& s : value) {
      if (!s.is_string()) break;
      stop.push_back(s.get<std::string>());
    }
  }
  if (stop.size() != (value.is_string() ? 1 : value.size()) ||
      std::any_of(stop.begin(), stop.end(), [](const std::string& s) { return s.empty(); })) {
    throw FieldError("stop", "'stop' must be a non-empty string or an array of at most 4 of them");
  }
  if (limits.tokenizer == nullptr) {
    throw FieldError("stop", "'stop': the model has no tokenizer to find stop strings with");
  }
  return stop;
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view text, const CompletionLimits& limits) {
  const ModelSpec& s = *limits.spec;
  json body;
  try {
    body = parse_json(text, "request body");
  } catch (const Error& e) {
    throw FieldError("body", e.what());
  }
  if (!body.is_object()) throw FieldError("body", "the request body must be a JSON object");

  CompletionRequest r;
  if (const json* v = find(body, "model")) {
    if (!v->is_string() || v->get<std::string>() != limits.model_name) {
      throw FieldError("model", fmt::format("'model': this server serves '{}', not {}",
                                            limits.model_name, json_excerpt(*v)));
    }
  }
  const json* prompt = find(body, "prompt");
  if (prompt == nullptr) throw FieldError("prompt", "'prompt' is required");
  r.prompt = prompt_field(*prompt, limits);
  if (r.prompt.empty()) throw FieldError("prompt", "'prompt' gives no tokens");
  if (static_cast<int64_t>(r.prompt.size()) > s.max_position) {
    throw FieldError("prompt", fmt::format("'prompt' has {} tokens, more than the model's context "
                                           "of {}",
                                           r.prompt.size(), s.max_position));
  }
  if (const json* v = find(body, "max_tokens")) {
    r.max_tokens = static_cast<int>(integer_field(*v, "max_tokens", 1, s.max_position));
  }
  if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > s.max_position) {
    throw FieldError("max_tokens",
                     fmt::format("'max_tokens': {} prompt tokens and {} to generate exceed the "
                                 "model's context of {}",
                                 r.prompt.size(), r.max_tokens, s.max_position));
  }
  r.sampling.temperature = 1.0f;
  if (const json* v = find(body, "temperature")) {
    const double t = number_field(*v, "temperature");
    if (t < 0.0 || t > 2.0) {
      throw FieldError("temperature", fmt::format("'temperature' must be in [0, 2], got {}", t));
    }
    r.sampling.temperature = static_cast<float>(t);
  }
  if (const json* v = find(body, "top_p")) {
    const double p = number_field(*v, "top_p");
    if (!(p > 0.0 && p <= 1.0)) {
      throw FieldError("top_p", fmt::format("'top_p' must be in (0, 1], got {}", p));
    }
    r.sampling.top_p = static_cast<float>(p);
  }
  if (const json* v = find(body, "seed")) {
    if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0)) {
      throw FieldError("seed",
                       fmt::format("'seed' must be an integer >= 0, got {}", json_excerpt(*v)));
    }
    r.sampling.seed = v->get<uint64_t>();
  }
  if (const json* v = find(body, "stop")) r.stop = stop_field(*v, limits);
  if (const json* v = find(body, "stream")) r.stream = bool_field(*v, "stream");
  if (const json* v = find(body, "echo"); v != nullptr && bool_field(*v, "echo")) {
    throw FieldError("echo", "'echo' is not supported; leave it false");
  }
  if (const json* v = find(body, "n"); v != nullptr && integer_field(*v, "n", 1, 1) != 1) {
    throw FieldError("n", "'n': one completion per request");
  }
  if (const json* v = find(body, "ignore_eos")) r.ignore_eos = bool_field(*v, "ignore_eos");
  if (const json* v = find(body, "kv_policy")) {
    if (!v->is_string()) {
      throw FieldError("kv_policy",
                       fmt::format("'kv_policy' must be a string, got {}", json_excerpt(*v)));
    }
    r.kv_policy = v->get<std::string>();
  }
  if (const json* v = find(body, "kv_budget")) {
    const double b = number_field(*v, "kv_budget");
    if (!(b > 0.0) || b > s.max_position) {
      throw FieldError("kv_budget",
                       fmt::format("'kv_budget' must be a fraction of the prompt in (0, 1] or "
                                   "tokens up to the context of {}, got {}",
                                   s.max_position, b));
    }
    r.kv_budget = b;
  }
  return r;
}

CompletionText::CompletionText(const Tokenizer* tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {}

bool CompletionText::add(int32_t token) {
  if (tokenizer_ == nullptr || stopped_) return !stopped_;
  // Ids past the tokenizer's vocabulary (padding rows of the embedding) have no text.
  if (token >= tokenizer_->vocab_size()) return true;
  known_.push_back(token);
  // The whole text again, not the new token's alone: pieces join (spaces, multi-byte characters).
  text_ = tokenizer_->decode(known_, true);
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s));
  if (cut == std::string::npos) return true;
  text_.resize(cut);
  stopped_ = true;
  return false;
}

std::string CompletionText::take_ready(bool finished) {
  size_t end = text_.size();
  if (!finished) {
    size_t hold = 0;
    for (const std::string& s : stop_) hold = std::max(hold, s.size() - 1);
    // A token that ends inside a multi-byte character decodes to U+FFFD until the rest comes.
    static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    if (std::string_view(text_).ends_with(kReplacement)) hold += kReplacement.size();
    end = end > hold ? end - hold : 0;
  }
  if (end <= taken_) return {};
  std::string ready = text_.substr(taken_, end - taken_);
  taken_ = end;
  return ready;
}

}  // namespace ekva::serve
