#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "budget/calibration.h"
#include "cli/commands.h"
#include "cli/device_args.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "tokenizer/tokenizer.h"

namespace ekva::cli {
namespace {

struct CalibrateArgs {
  std::string model_dir;
  std::vector<std::string> data;
  int64_t tokens = 8192;
  int chunk = 512;
  bool ablation = false;
  std::string out;
  bool json = false;
  DeviceArgs device;
};

std::vector<std::vector<int32_t>> chunks_of(const CalibrateArgs& a, const Tokenizer& tokenizer,
                                            int max_position) {
  if (a.chunk < 2 || a.chunk > max_position) {
    fail(ErrorKind::kInvalidArgument, "--chunk {} must be in [2, {}] (the model's context)",
         a.chunk, max_position);
  }
  if (a.tokens < a.chunk) {
    fail(ErrorKind::kInvalidArgument, "--tokens {} is fewer than one --chunk of {}", a.tokens,
         a.chunk);
  }
  std::vector<int32_t> ids;
  for (const std::string& file : a.data) {
    const std::vector<int32_t> part =
        encode_prefix(tokenizer, read_text_file(file), static_cast<size_t>(a.tokens) - ids.size());
    ids.insert(ids.end(), part.begin(), part.end());
    if (static_cast<int64_t>(ids.size()) >= a.tokens) break;
  }
  if (ids.size() < static_cast<size_t>(a.chunk)) {
    fail(ErrorKind::kInvalidArgument, "--data holds {} tokens, fewer than one chunk of {}",
         ids.size(), a.chunk);
  }
  const auto chunks = calibration_chunks(ids, a.chunk, a.tokens);
  return chunks;
}

int run_calibrate(const CalibrateArgs& a) {
  check_output_file(a.out);
  const auto model = Model::load(a.model_dir);
  if (!has_tokenizer(a.model_dir)) {
    fail(ErrorKind::kNotFound, "{}: no tokenizer.json or tokenizer.model to read --data with",
         a.model_dir);
  }
  const auto chunks = chunks_of(a, *load_tokenizer(a.model_dir), model->spec().max_position);
  CalibrationOptions options;
  options.chunk_tokens = a.chunk;
  options.ablation = a.ablation;
  use_device(a.device, "", options.engine);
  const CalibrationStats stats =
      calibrate(*model, chunks, options, [](int done, int total, const std::string& pass) {
        fmt::print(stderr, "\rcalibrate {:<10} [{:<30}] {}/{}", pass,
                   std::string(30 * done / total, '#'), done, total);
        if (done == total) fmt::print(stderr, "\n");
      });
  stats.save(a.out);
  const nlohmann::json summary = {{"out", a.out},
                                  {"tokens", stats.tokens},
                                  {"chunks", stats.chunks},
                                  {"base_loss", stats.base_loss},
                                  {"stats_seconds", stats.stats_seconds},
                                  {"ablation_seconds", stats.ablation_seconds}};
  if (a.json) {
    fmt::print("{}\n", summary.dump());
  } else {
    fmt::print("calibrated on {} tokens ({} chunks): loss {:.4f}, {:.1f} s{}; wrote {}\n",
               stats.tokens, stats.chunks, stats.base_loss, stats.stats_seconds,
               a.ablation ? fmt::format(", ablation {:.1f} s", stats.ablation_seconds) : "", a.out);
  }
  return 0;
}

}  // namespace

void add_calibrate(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("calibrate",
                                 "Measure routing and attention statistics over calibration text");
  auto a = std::make_shared<CalibrateArgs>();
  cmd->add_option("--model", a->model_dir, "Model directory (with its tokenizer)")->required();
  cmd->add_option("--data", a->data, "UTF-8 text files")->required()->expected(1, -1);
  cmd->add_option("--tokens", a->tokens, "Calibration tokens at most")->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Tokens per prefill chunk")->capture_default_str();
  cmd->add_flag("--ablation", a->ablation,
                "Also measure each expert's loss contribution (extra passes)");
  cmd->add_option("--out", a->out, "Statistics JSON to write")->required();
  cmd->add_flag("--json", a->json, "Print a JSON summary");
  add_device_option(cmd, a->device);
  cmd->callback([&action, a] { action = [a] { return run_calibrate(*a); }; });
}

}  // namespace ekva::cli
