#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/device_args.h"
#include "core/error.h"
#include "engine/engine.h"
#include "io/safetensors.h"

namespace ekva::cli {
namespace {

int run_forward(const std::string& model_dir, const std::string& input, const std::string& out,
                const DeviceArgs& device) {
  const auto model = Model::load(model_dir);
  const ModelSpec& s = model->spec();
  SafetensorsFile in(input);
  const TensorView& ids = in.get("input_ids");
  if (ids.dtype != DType::kI64 || ids.shape.size() != 2 || ids.shape[0] <= 0 || ids.shape[1] <= 0) {
    fail(ErrorKind::kInvalidFile,
         "{}: input_ids must be a non-empty int64 [B, T] tensor, got {} {}", input,
         dtype_name(ids.dtype), ids.shape_string());
  }
  const int B = static_cast<int>(ids.shape[0]);
  const int T = static_cast<int>(ids.shape[1]);
  const auto* id = static_cast<const int64_t*>(ids.data);
  EngineOptions engine_options;
  engine_options.num_sequences = B;
  use_device(device, "", engine_options);
  Engine engine(*model, engine_options);
  ForwardBatch batch;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t tok = id[static_cast<size_t>(b) * T + t];
      if (tok < 0 || tok >= s.vocab_size) {
        fail(ErrorKind::kInvalidArgument,
             "{}: input_ids[{}, {}] = {} is outside the vocabulary [0, {})", input, b, t, tok,
             s.vocab_size);
      }
      batch.add(static_cast<int32_t>(tok), b, t);
    }
  }
  RouterLogitsRecorder capture;
  const std::vector<float> logits = engine.step(batch, &capture);
  std::vector<TensorToWrite> tensors;
  tensors.push_back({"logits", DType::kF32, {B, T, s.vocab_size}, logits.data()});
  std::vector<std::string> names;
  for (size_t i = 0; i < capture.logits.size(); ++i)
    names.push_back(fmt::format("router_logits.{}", i));
  for (size_t i = 0; i < capture.logits.size(); ++i) {
    tensors.push_back({names[i],
                       DType::kF32,
                       {static_cast<int64_t>(B) * T, s.num_experts},
                       capture.logits[i].data()});
  }
  write_safetensors(out, tensors, {{"producer", "ekva forward"}});
  return 0;
}

}  // namespace

void add_forward(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "forward", "Run one forward pass: input_ids in, logits and router logits out");
  auto model_dir = std::make_shared<std::string>();
  auto input = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("--model", *model_dir, "Model directory")->required();
  cmd->add_option("--input", *input, "safetensors file with input_ids [B, T] int64")->required();
  cmd->add_option("--out", *out, "Output safetensors: logits [B, T, V], router_logits.N [B*T, E]")
      ->required();
  auto device = std::make_shared<DeviceArgs>();
  add_device_option(cmd, *device);
  cmd->callback([&action, model_dir, input, out, device] {
    action = [=] { return run_forward(*model_dir, *input, *out, *device); };
  });
}

}  // namespace ekva::cli
