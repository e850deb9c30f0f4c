#include <fmt/core.h>
#include <omp.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/device_args.h"
#include "cli/model_args.h"
#include "cli/policy_args.h"
#include "core/error.h"
#include "engine/generate.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string ids;
  std::string prompt;
  int max_new_tokens = 32;
  SamplingOptions sampling;
  bool json = false;
  PolicyArgs kv;
  DeviceArgs device;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < std::numeric_limits<int32_t>::min() ||
          v > std::numeric_limits<int32_t>::max()) {
        throw std::invalid_argument(item);
      }
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument, "--ids: '{}' is not an integer", item);
    }
  }
  return ids;
}

int run_generate(const GenerateArgs& a) {
  const auto model = Model::load(a.model_dir);
  const ModelSpec& s = model->spec();
  // The model directory's tokenizer encodes --prompt (with its BOS/EOS) and decodes --json's text.
  std::unique_ptr<Tokenizer> tokenizer;
  if ((!a.prompt.empty() || a.json) && has_tokenizer(a.model_dir)) {
    tokenizer = load_tokenizer(a.model_dir);
  }
  if (!a.prompt.empty() && !tokenizer) {
    fail(ErrorKind::kNotFound, "--prompt: {} has no tokenizer.json or tokenizer.model; use --ids",
         a.model_dir);
  }
  const std::vector<int32_t> prompt =
      a.prompt.empty() ? parse_ids(a.ids) : tokenizer->encode(a.prompt, true);
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= s.vocab_size) {
      fail(ErrorKind::kInvalidArgument,
           "{}: token {} at index {} is outside the vocabulary [0, {})",
           a.prompt.empty() ? "--ids" : "--prompt", prompt[i], i, s.vocab_size);
    }
  }
  EngineOptions engine_options;
  engine_options.kv = kv_format(a.kv);
  const std::string device = use_device(a.device, a.kv.kv_dtype, engine_options);
  Engine engine(*model, engine_options, make_policy_options(a.kv, s));
  GenerateOptions options;
  options.max_new_tokens = a.max_new_tokens;
  options.sampling = a.sampling;
  const GenerateResult r = generate(engine, prompt, options);
  const double prefill_tps = r.prefill_seconds > 0 ? r.prefill_tokens / r.prefill_seconds : 0.0;
  const double decode_tps = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0.0;
  if (a.json) {
    nlohmann::json j = {{"tokens", r.tokens},
                        {"device", device},
                        {"stopped_at_eos", r.stopped_at_eos},
                        {"stats",
                         {{"prompt_tokens", r.prefill_tokens},
                          {"generated_tokens", r.tokens.size()},
                          {"prefill_tokens_per_s", prefill_tps},
                          {"decode_tokens_per_s", decode_tps},
                          {"kv_bytes", r.kv_bytes},
                          {"threads", omp_get_max_threads()}}},
                        {"kv",
                         {{"policy", a.kv.policy},
                          {"budget", a.kv.budget ? nlohmann::json(*a.kv.budget) : nlohmann::json()},
                          {"dtype", dtype_name(engine.layout().dtype())},
                          {"bytes_in_use", r.kv_bytes},
                          {"bytes_full", r.kv_bytes_full},
                          {"retained_tokens", r.retained_tokens},
                          {"total_tokens", r.total_tokens}}}};
    if (tokenizer) {
      // Ids past the tokenizer's vocabulary (padding rows of the embedding) have no text.
      std::vector<int32_t> known;
      for (const int32_t id : r.tokens) {
        if (id < tokenizer->vocab_size()) known.push_back(id);
      }
      j["text"] = tokenizer->decode(known, true);
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("{}\n", fmt::join(r.tokens, ","));
  fmt::print(
      stderr,
      "{}: prefill {} tokens at {:.1f} tok/s, decode {} steps at {:.1f} tok/s, KV {} bytes\n",
      device, r.prefill_tokens, prefill_tps, r.decode_steps, decode_tps, r.kv_bytes);
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "generate", "Generate tokens after a prompt (greedy unless --temperature > 0)");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--model", a->model_dir, "Model directory")->required();
  auto* ids = cmd->add_option("--ids", a->ids, "Prompt token ids, comma separated");
  auto* prompt =
      cmd->add_option("--prompt", a->prompt, "Prompt text (needs the model's tokenizer)");
  ids->excludes(prompt);
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Tokens to generate at most")
      ->capture_default_str();
  add_sampling_options(cmd, a->sampling);
  cmd->add_flag("--json", a->json, "Print one JSON object with tokens, stats and KV use");
  add_policy_options(cmd, a->kv);
  add_device_option(cmd, a->device);
  cmd->callback([&action, a, ids, prompt] {
    if (ids->count() == 0 && prompt->count() == 0) throw CLI::RequiredError("--ids or --prompt");
    action = [a] { return run_generate(*a); };
  });
}

}  // namespace ekva::cli
